"""What `rlprobe-patch cluster` runs on each node of a Ray cluster, as a Ray task.

This module uses the standard library only and is shipped to the nodes by value (pickled
with the task), so that it runs on a node where rlprobe-patch is not installed and says so.
On the node it runs the local command, `python -m rlprobe_patch ... --json`, as a subprocess:
the node-local code path (plan, lock, journal, crash safety) is exactly the local one.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

# On a node, `RLPROBE_PATCH_FAULT_APPLY` becomes `RLPROBE_PATCH_FAULT` for the write of
# `cluster apply` only (not for its plan, nor for the rollback): the cluster tests' fault hook.
APPLY_FAULT = "RLPROBE_PATCH_FAULT_APPLY"


def _die_with_parent() -> None:
    """The local command dies with the Ray worker (a node lost mid-write stops writing, as a machine would)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _tool_version(python: str) -> str | None:
    """The version of the rlprobe-patch that `python` runs (`python -m rlprobe_patch --version`: the tool itself
    answers), None where it has none."""
    try:
        done = subprocess.run([python, "-m", "rlprobe_patch", "--version"], capture_output=True, text=True, timeout=120)
    except OSError:
        return None
    return done.stdout.strip().rpartition(" ")[2] if done.returncode == 0 else None


def _body(diff_text: str) -> str:
    """A recorded diff without its provenance header (which names the node's path and time)."""
    start = diff_text.find("diff --git")
    return diff_text[start:] if start >= 0 else ""


def _records(root: Path) -> tuple[list[dict[str, Any]], bool, str]:
    """(records of the ledger, a journal pending, the recorded diffs' bodies) of one tree."""
    state = root / ".rlprobe-patch"
    try:
        ledger = json.loads((state / "ledger.json").read_text())
    except (OSError, ValueError):
        ledger = {}
    records = [r for r in ledger.get("records", []) if isinstance(r, dict)] if isinstance(ledger, dict) else []
    bodies = []
    for record in records:
        name = record.get("diff") or f"diffs/{record.get('id')}.diff"
        try:
            bodies.append(_body((state / str(name)).read_text()))
        except OSError:
            bodies.append("")
    return records, (state / "journal.json").exists(), "".join(bodies)


def _facts(document: dict[str, Any]) -> list[dict[str, Any]]:
    """Per tree of a local command's JSON: package, version, root, patch states, records, journal, hashes."""
    trees = []
    for entry in document.get("trees") or []:
        tree = entry.get("tree") or {}
        root = tree.get("root") or entry.get("root")
        if not root:
            continue
        records, journal, recorded = _records(Path(root))
        planned = entry.get("diff") or ""
        written = entry.get("status") == "applied"  # the states were planned before this apply wrote them
        states = {p["id"]: p["state"] for p in entry.get("patches") or []}
        if written:
            states = {k: "applied" if v == "applicable" else v for k, v in states.items()}
        trees.append(
            {
                "package": tree.get("package"),
                "version": tree.get("version"),
                "root": root,
                "patches": states,
                "records": [r.get("id") for r in records],
                "record_patches": sorted({p.get("id") for r in records for p in r.get("patches") or []}),
                "journal": journal,
                "planned": bool(planned),
                # What the tree is once patched, relative to its original: recorded diffs, then the plan.
                "target": hashlib.sha256((recorded + planned).encode()).hexdigest()[:16],
            }
        )
    return trees


def run_local(args: list[str], python: str | None, node_id: str, write: bool = False) -> dict[str, Any]:
    """Run `rlprobe-patch ARGS --json` on this node; `$VAR` in ARGS is expanded in this node's environment.

    The command runs in this worker's Python, else in `python` (the training environment's, from
    --python), whichever imports rlprobe_patch. `write`: the apply phase (the fault hook applies).
    """
    args = [os.path.expandvars(a) for a in args]
    report: dict[str, Any] = {
        "node_id": node_id,
        "host": socket.gethostname(),
        "python": sys.executable,
        "python_version": platform.python_version(),
        "args": args,
    }
    unexpanded = [a for a in args if "$" in a]
    if unexpanded:
        report.update(code=3, document={}, message=f"not set on this node: {', '.join(unexpanded)}")
        return report
    runner, version = None, None
    for candidate in dict.fromkeys(c for c in (sys.executable, python) if c):
        version = _tool_version(candidate)
        if version is not None:
            runner = candidate
            break
    report["tool_version"] = version
    if runner is None:
        report.update(code=None, missing=True, document={}, message="rlprobe_patch is not importable on this node")
        return report
    report["runner"] = runner
    env = dict(os.environ)
    env.pop("RLPROBE_PATCH_FAULT", None)
    if write and env.get(APPLY_FAULT):
        env["RLPROBE_PATCH_FAULT"] = env[APPLY_FAULT]
    done = subprocess.run(
        [runner, "-m", "rlprobe_patch", *args, "--json"],
        capture_output=True,
        text=True,
        env=env,
        preexec_fn=_die_with_parent,
    )
    try:
        document = json.loads(done.stdout) if done.stdout.strip() else {}
    except ValueError:
        document = {}
    report.update(code=done.returncode, document=document, stderr=done.stderr[-4000:])
    report["message"] = document.get("message", "") if document.get("ok") is False else ""
    if done.returncode < 0:
        report["message"] = f"the local command was killed by signal {-done.returncode}"
    report["trees"] = _facts(document)
    return report
