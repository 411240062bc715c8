"""`rlprobe-patch cluster apply|verify|status|revert`: every node of a Ray cluster, as one transaction.

One Ray task per alive node, pinned to it (node affinity, not soft), runs the local command in
that node's environment (`cluster_node.run_local`). apply plans on every node first (`apply
--dry-run`: trees, versions, states, the hash of the diff) and writes nowhere unless all nodes
agree; then every node applies, and if one fails the nodes already written are reverted.
Ray is imported here only, and only when a cluster command runs.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import click

from rlprobe_patch import cluster_node
from rlprobe_patch.cli_base import Out, command, more_roots, tree_options
from rlprobe_patch.errors import ExitCode, RefusedError
from rlprobe_patch.trees import BACKENDS, MODES, ROOT_OPTIONS, WORKER_IMPLS

Report = dict[str, Any]
_STDOUT: list[TextIO] = []  # the real stdout while a cluster command runs (Ray's own messages go to stderr)


def quiet_ray(fn: Callable[..., int]) -> Callable[..., int]:
    """Run a cluster command with stdout sent to stderr (Ray prints node events there), emit on the real one."""

    @functools.wraps(fn)
    def wrapper(out: Out, **kwargs: Any) -> int:
        _STDOUT.append(sys.stdout)
        try:
            with contextlib.redirect_stdout(sys.stderr):
                return fn(out, **kwargs)
        finally:
            _STDOUT.pop()
            disconnect()

    return wrapper


def disconnect() -> None:
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


# -- reaching the nodes -----------------------------------------------------------------------
def connect(address: str | None) -> list[dict[str, Any]]:
    """Join the Ray cluster at `address` (or RAY_ADDRESS, else `auto`); its alive nodes, head first."""
    import os

    try:
        import ray
    except ImportError:
        raise RefusedError(
            "Ray is not installed in this Python", hint="pip install 'rlprobe-patch[ray]' (the driver needs Ray)"
        ) from None
    address = address or os.environ.get("RAY_ADDRESS") or "auto"
    if address != "auto" and not ray.is_initialized():  # Ray waits minutes on a dead address: ask first
        import socket

        host, _, port = address.removeprefix("ray://").rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
        except (OSError, ValueError) as exc:
            raise RefusedError(
                f"cannot reach a Ray cluster at {address!r}: {exc}",
                hint="pass --address (auto, HOST:PORT of the GCS, or ray://HOST:10001) or set RAY_ADDRESS",
            ) from None
    if not ray.is_initialized():
        try:
            ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise RefusedError(
                f"cannot reach a Ray cluster at {address!r}: {exc}",
                hint="pass --address (auto, HOST:PORT of the GCS, or ray://HOST:10001) or set RAY_ADDRESS",
            ) from None
    ray.cloudpickle.register_pickle_by_value(cluster_node)  # type: ignore[no-untyped-call]  # nodes need not have rlprobe-patch
    nodes = [n for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]
    head = [n for n in nodes if "node:__internal_head__" in n.get("Resources", {})]
    return head + [n for n in nodes if n not in head]


def run_on(
    nodes: list[dict[str, Any]],
    args: list[str],
    python: str | None,
    progress: Callable[[str], None],
    what: str,
    write: bool = False,
) -> dict[str, Report]:
    """`rlprobe-patch ARGS --json` on each node (a task pinned to it); reports by node id, as they finish."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, max_retries=0)(cluster_node.run_local)
    pending = {}
    for node in nodes:
        node_id = node["NodeID"]
        strategy = NodeAffinitySchedulingStrategy(node_id, soft=False)
        pending[task.options(scheduling_strategy=strategy).remote(args, python, node_id, write)] = node
    reports: dict[str, Report] = {}
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        node = pending.pop(ready[0])
        try:
            report = ray.get(ready[0])
        except ray.exceptions.RayError as exc:  # the node (or its worker) died under the task
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            report = {"node_id": node["NodeID"], "lost": True, "code": None, "message": f"node lost: {first}"}
        report.setdefault("host", node.get("NodeManagerAddress", "?"))
        reports[node["NodeID"]] = report
        progress(f"node {_short(node['NodeID'])} ({report['host']}): {what}: {_outcome(report)}")
    return {n["NodeID"]: reports[n["NodeID"]] for n in nodes}


def _short(node_id: str) -> str:
    return node_id[:8]


def _outcome(report: Report) -> str:
    if report.get("lost"):
        return "LOST"
    if report.get("missing"):
        return "rlprobe-patch not importable"
    return "ok" if report.get("code") == 0 else f"exit {report.get('code')}: {report.get('message', '')}"


# -- agreement --------------------------------------------------------------------------------
def _majority(values: dict[str, Any]) -> Any:
    """The value most nodes hold, or a sentinel (nobody agrees) when the top is a tie."""
    counts = Counter(values.values()).most_common()
    if len(counts) > 1 and counts[0][1] == counts[1][1]:
        return object()
    return counts[0][0]


def disagreements(reports: dict[str, Report], targets: bool = True, records: bool = False) -> dict[str, list[str]]:
    """Per node, why it differs from the others: tool, trees, versions, the change (target hash);
    with `records`, the patches a tree to be written already carries (a tree carrying none, or one
    that is not written, is left to the target check: a node that joined later is patched alone)."""
    reasons: dict[str, list[str]] = {node: [] for node in reports}
    if len(reports) < 2:
        return reasons
    tools = {n: r.get("tool_version") for n, r in reports.items()}
    ref = _majority(tools)
    for n, v in tools.items():
        if v != ref:
            reasons[n].append(f"rlprobe-patch {v} here, {_others(tools, n)} elsewhere")
    trees = {n: {t["package"]: t for t in r.get("trees", [])} for n, r in reports.items()}
    for package in sorted({p for by in trees.values() for p in by}):
        versions = {n: by[package]["version"] if package in by else None for n, by in trees.items()}
        ref = _majority(versions)
        for n, v in versions.items():
            if v != ref:
                here = f"{package} {v}" if v else f"no {package} tree"
                reasons[n].append(f"{here} here; elsewhere: {_others(versions, n, package)}")
        carried = {n: ", ".join(by[package].get("record_patches") or []) for n, by in trees.items() if package in by}
        ref_carried = _majority(carried)
        for n, v in carried.items() if records else ():
            if v and v != ref_carried and trees[n][package].get("planned"):
                elsewhere = " or ".join(sorted({c or "no patch" for c in carried.values() if c != v}))
                reasons[n].append(
                    f"{package} carries records of {v} here; of {elsewhere} elsewhere: cluster "
                    "apply starts every node from the same records (`rlprobe-patch revert` on this node first)"
                )
        same = {n: by[package]["target"] for n, by in trees.items() if versions[n] == ref and ref is not None}
        if not targets:
            continue
        target = _majority(same) if same else None
        for n, t in same.items():
            if t != target:
                reasons[n].append(
                    f"{package}: the patched tree would differ from the other nodes' (target {t}): a drifted or "
                    "edited tree, or patched with other options"
                )
    return reasons


def _others(values: dict[str, Any], node: str, package: str = "") -> str:
    seen = sorted({str(v) for n, v in values.items() if n != node and v != values[node]})
    if package:
        seen = [f"{package} {v}" if v != "None" else f"no {package} tree" for v in seen]
    return ", ".join(seen) or "?"


def _failures(reports: dict[str, Report], ok_codes: tuple[int, ...] = (0,)) -> dict[str, str]:
    failed = {}
    for n, r in reports.items():
        if r.get("lost") or r.get("missing") or r.get("code") not in ok_codes:
            failed[n] = r.get("message") or _outcome(r)
    return failed


def missing_refusal(nodes: dict[str, Report]) -> RefusedError | None:
    missing = {n: r for n, r in nodes.items() if r.get("missing")}
    if not missing:
        return None
    pythons = sorted({r["python"] for r in missing.values()})
    return RefusedError(
        f"rlprobe-patch is not importable on {len(missing)} node(s); nothing was done on any node",
        details=[f"node {n} ({r['host']}): {r['python']}" for n, r in missing.items()],
        hint="install it into the Python the Ray workers run on each node: "
        + "; ".join(f"{p} -m pip install rlprobe-patch" for p in pythons)
        + " (or bake it into the image, or pass --python with an interpreter that has it)",
    )


# -- output -----------------------------------------------------------------------------------
def emit(
    out: Out,
    command_name: str,
    reports: dict[str, Report],
    results: dict[str, str],
    reasons: dict[str, list[str]],
    verdict: str,
    code: int,
) -> int:
    """The per-node table (text) or one JSON document; returns the exit code."""
    disconnect()  # no more messages from Ray's threads
    with contextlib.redirect_stdout(_STDOUT[-1] if _STDOUT else sys.stdout):
        return _emit(out, command_name, reports, results, reasons, verdict, code)


def _emit(
    out: Out,
    command_name: str,
    reports: dict[str, Report],
    results: dict[str, str],
    reasons: dict[str, list[str]],
    verdict: str,
    code: int,
) -> int:
    nodes = []
    for n, r in reports.items():
        nodes.append(
            {
                "node_id": n,
                "host": r.get("host"),
                "python": r.get("runner") or r.get("python"),
                "python_version": r.get("python_version"),
                "tool_version": r.get("tool_version"),
                "result": results.get(n, ""),
                "reasons": reasons.get(n, []),
                "exit_code": r.get("code"),
                "trees": r.get("trees", []),
                "local": r.get("document", {}),
            }
        )
    out.emit({"ok": code == 0, "command": command_name, "verdict": verdict, "exit_code": code, "nodes": nodes})
    out.line(f"{'NODE':<9} {'HOST':<15} {'PYTHON':<8} {'TREE':<20} {'RECORD':<24} RESULT", bold=True)
    for node in nodes:
        trees = node["trees"] or [{}]
        for i, tree in enumerate(trees):
            first = i == 0
            what = f"{tree.get('package')} {tree.get('version')}" if tree else "-"
            record = (tree.get("records") or ["-"])[-1] if tree else "-"
            out.line(
                f"{_short(node['node_id']) if first else '':<9} {node['host'] if first else '':<15} "
                f"{(node['python_version'] or '?') if first else '':<8} {what:<20} {record:<24} "
                f"{node['result'] if first else ''}",
                fg=None if node["exit_code"] == 0 and not node["reasons"] else ("red" if first else None),
            )
            if tree:
                out.line(f"{'':<9} at {tree.get('root')} (python {node['python']})", dim=True)
            by_state: dict[str, list[str]] = {}
            for patch, state in (tree.get("patches") or {}).items():
                by_state.setdefault(state, []).append(patch)
            for state, patches in by_state.items():
                out.line(f"{'':<9} {state}: {', '.join(patches)}", dim=True)
        for reason in node["reasons"]:
            out.line(f"{'':<9} - {reason}", fg="yellow")
    out.line(verdict, fg="green" if code == 0 else "red", bold=True)
    return code


# -- the commands -----------------------------------------------------------------------------
@click.group("cluster")
def cluster() -> None:
    """Patch, verify, show or revert every node of a Ray cluster (needs `pip install 'rlprobe-patch[ray]'`)."""


def cluster_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = tree_options(fn)
    return click.option(
        "--address",
        metavar="ADDR",
        help="The Ray cluster: auto, HOST:PORT, or ray://HOST:10001 (default: RAY_ADDRESS, else auto). "
        "`$VAR` in a root or --python is expanded on each node.",
    )(fn)


def _tree_args(python: str | None, roots: dict[str, Path | None]) -> list[str]:
    args = ["--python", python] if python else []
    for package, root in roots.items():
        if root is not None:
            args += [ROOT_OPTIONS[package], str(root)]
    return args


def _resolved_roots(report: Report) -> list[str]:
    """The roots a node's local command found, as options (for the rollback: exactly those trees)."""
    args: list[str] = []
    for tree in report.get("trees", []):
        if tree.get("package") in ROOT_OPTIONS:
            args += [ROOT_OPTIONS[tree["package"]], tree["root"]]
    return args


@cluster.command("apply")
@cluster_options
@click.option("--backend", type=click.Choice(BACKENDS), help="Training backend to hook (needed for verl).")
@click.option("--mode", type=click.Choice(MODES), help="Apply the whole patch set of a collection mode.")
@click.option("--only", metavar="ID[,ID]", help="Apply just these patches.")
@click.option("--skip", metavar="ID[,ID]", help="Leave these patches out of the set.")
@click.option("--worker-impl", type=click.Choice(WORKER_IMPLS), default="auto", show_default=True)
@click.option("--script", metavar="PATH", help="The training script (same path on every node).")
@click.option("--force", is_flag=True, help="Allow a release outside the patch's version range.")
@click.option("--msprobe-config", metavar="PATH", help="Default msprobe config.json baked into the verl hooks.")
@click.option("--sglang-config", metavar="PATH", help="Default msprobe config.json baked into the SGLang hook.")
@click.option("--dry-run", is_flag=True, help="Plan on every node and compare; write nothing.")
@command
@quiet_ray
def apply_cmd(
    out: Out,
    address: str | None,
    python: str | None,
    dry_run: bool,
    **options: Any,
) -> int:
    """Plan on every node, refuse unless all agree, apply everywhere; roll back the others if one fails."""
    roots = {p: options.pop(f"{p}_root", None) for p in ROOT_OPTIONS} | more_roots()
    args = ["apply", *_tree_args(python, roots)]
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value not in (None, False):
            args += [flag, str(value)]
    nodes = connect(address)
    out.progress(f"{len(nodes)} node(s); planning on each")
    plans = run_on(nodes, [*args, "--dry-run"], python, out.progress, "plan")
    refusal = missing_refusal(plans)
    if refusal:
        raise refusal
    interrupted = [n for n in nodes if any(t["journal"] for t in plans[n["NodeID"]].get("trees", []))]
    repaired: dict[str, str] = {}
    if interrupted:  # a write killed earlier: the local engine finishes it (status), then plan again
        status_args = ["status", *_tree_args(python, roots)]
        for n, r in run_on(interrupted, status_args, python, out.progress, "finishing an interrupted write").items():
            done = [m for t in (r.get("document") or {}).get("trees", []) for m in t.get("recovered", [])]
            repaired[n] = "; ".join(done) or _outcome(r)
        plans.update(run_on(interrupted, [*args, "--dry-run"], python, out.progress, "plan again"))
    reasons = disagreements(plans, records=True)
    for n, r in plans.items():
        if n in repaired:
            reasons[n].insert(0, f"recovered an interrupted write: {repaired[n]}")
        if r.get("lost") or r.get("code") != 0:
            reasons[n].append(f"refused: {r.get('message') or _outcome(r)}")
            for detail in (r.get("document") or {}).get("details", []):
                reasons[n].append(f"  {detail}")
    blocking = {n for n, why in reasons.items() if any(not w.startswith("recovered") for w in why)}
    writers = [n for n in nodes if any(t["planned"] for t in plans[n["NodeID"]].get("trees", []))]
    if blocking:
        results = {
            n: ("refused" if plans[n].get("code") != 0 else "differs") if n in blocking else "agrees" for n in plans
        }
        verdict = f"nodes disagree or refuse ({len(blocking)} of {len(plans)}): nothing was written on any node"
        return emit(out, "apply", plans, results, reasons, verdict, int(ExitCode.REFUSED))
    if dry_run or not writers:
        results = {n: ("would apply" if n in {w["NodeID"] for w in writers} else "already applied") for n in plans}
        verdict = (
            f"all {len(plans)} node(s) agree; dry run: nothing written"
            if dry_run
            else f"already applied on all {len(plans)} node(s): nothing written"
        )
        return emit(out, "apply", plans, results, reasons, verdict, int(ExitCode.OK))
    out.progress(f"all {len(plans)} node(s) agree; applying on {len(writers)}")
    applied = run_on(writers, args, python, out.progress, "apply", write=True)
    for n, r in applied.items():  # a failed (or lost) node's trees are those it planned
        r["trees"] = r.get("trees") or plans[n].get("trees", [])
    reports = {**plans, **applied}
    failed = _failures(applied)
    results = {n: ("applied" if n in applied else "already applied") for n in plans}
    if not failed:
        verdict = f"applied on all {len(plans)} node(s)"
        return emit(out, "apply", reports, results, reasons, verdict, int(ExitCode.OK))
    # One node failed: revert every node this run wrote to, the failed ones too (revert finishes a kept journal).
    for n, why in failed.items():
        reasons[n].append(f"failed: {why}")
        results[n] = "LOST" if applied[n].get("lost") else "write failed"
    undo = [w for w in writers if not applied[w["NodeID"]].get("lost")]
    out.progress(f"{len(failed)} node(s) failed; rolling back {len(undo)}")
    rollback = {n["NodeID"]: _revert_exactly(n, plans[n["NodeID"]], python, out) for n in undo}
    for n, (ok, text) in rollback.items():
        results[n] = f"{results[n]}; rolled back" if ok else f"{results[n]}; ROLLBACK FAILED"
        reasons[n].append(text)
        found = {t["root"]: t.get("records", []) for t in plans[n].get("trees", [])}
        for tree in applied[n]["trees"] if ok else []:
            tree["records"] = found.get(tree["root"], [])  # back to the records the plan found
    lost = [n for n in failed if applied[n].get("lost")]
    for n in lost:
        reasons[n].append(
            "its tree may hold an interrupted write (journal): the next `rlprobe-patch cluster apply` or "
            "`cluster revert` finishes it once the node is back"
        )
    # A local command killed (negative code) or lost with its node: a write that did not finish (7).
    codes = [applied[n].get("code") for n in failed]
    code = max(c if isinstance(c, int) and 0 < c < 128 else int(ExitCode.WRITE_FAILED) for c in codes)
    stuck = [n for n, (ok, _) in rollback.items() if not ok]
    verdict = f"apply failed on {len(failed)} node(s); " + (
        f"rolled back on {len(rollback)}: every reachable tree as before"
        if not stuck
        else f"ROLLBACK FAILED on {', '.join(_short(n) for n in stuck)}: see their lines"
    )
    return emit(out, "apply", reports, results, reasons, verdict, code)


def _revert_exactly(node: dict[str, Any], plan: Report, python: str | None, out: Out) -> tuple[bool, str]:
    """Take each tree the node planned back to what the plan found: a tree that had records (an
    upgrade, or patches added to a patched tree) by undoing the newest apply (`revert --back-to`
    the records the plan saw), an unpatched one by reverting what this run recorded."""
    trees = [t for t in plan.get("trees", []) if t.get("package") in ROOT_OPTIONS]
    patched = {t["root"]: t for t in trees if t.get("records")}  # trees sharing a root share its records
    commands = [
        ["revert", ROOT_OPTIONS[t["package"]], t["root"], "--back-to", ",".join(t["records"])] for t in patched.values()
    ]
    unpatched = [t for t in trees if t["root"] not in patched]
    if unpatched:
        commands.append(["revert", *_resolved_roots({"trees": unpatched})])
    done = []
    for args in commands:
        report = run_on([node], args, python, out.progress, "rollback")[node["NodeID"]]
        if report.get("code") == 0:
            recovered = [m for t in report["document"].get("trees", []) for m in t.get("recovered", [])]
            ids = [i for t in report["document"].get("trees", []) for i in t.get("reverted", [])]
            word = "undid" if "--back-to" in args else "reverted"
            done.append(
                f"{word} {', '.join(ids) or 'nothing (nothing was written)'}"
                + (f" after finishing the interrupted write ({'; '.join(recovered)})" if recovered else "")
            )
        elif report.get("message", "").startswith("nothing recorded for"):
            done.append("nothing was written")
        else:
            return False, f"rollback failed: {report.get('message') or _outcome(report)}"
    return True, "rolled back: " + "; ".join(done)


@cluster.command("verify")
@cluster_options
@click.option("--backend", type=click.Choice(BACKENDS), help="Also check this backend's hook.")
@click.option("--mode", type=click.Choice(MODES), help="Also check this mode's patch set.")
@click.option("--script", metavar="PATH", help="The training script (same path on every node).")
@click.option("--recheck", is_flag=True, help="Parse every hooked file again.")
@command
@quiet_ray
def verify_cmd(out: Out, address: str | None, python: str | None, **options: Any) -> int:
    """Verify every node; fails when one node fails or the nodes run different releases."""
    roots = {p: options.pop(f"{p}_root", None) for p in ROOT_OPTIONS} | more_roots()
    args = ["verify", *_tree_args(python, roots)]
    for name, value in options.items():
        if value is True:
            args.append("--" + name)
        elif value:
            args += ["--" + name, str(value)]
    reports = run_on(connect(address), args, python, out.progress, "verify")
    refusal = missing_refusal(reports)
    if refusal:
        raise refusal
    reasons = disagreements(reports)
    failed = _failures(reports)
    results = {}
    for n, r in reports.items():
        results[n] = "verified" if n not in failed else "FAILED"
        if n in failed:
            reasons[n].append(failed[n])
            for tree in (r.get("document") or {}).get("trees", []):
                reasons[n] += [f"{c['name']}: {c.get('detail', '')}" for c in tree.get("checks", []) if not c["ok"]]
    bad = {n for n, why in reasons.items() if why}
    other = [int(r["code"]) for n, r in reports.items() if n in failed and r.get("code") not in (4, None)]
    code = other[0] if other else int(ExitCode.VERIFY_FAILED if bad else ExitCode.OK)
    verdict = (
        f"verified on all {len(reports)} node(s)"
        if not bad
        else (f"verification FAILED on {len(bad)} of {len(reports)} node(s)")
    )
    return emit(out, "verify", reports, results, reasons, verdict, code)


@cluster.command("status")
@cluster_options
@click.option("--backend", type=click.Choice(BACKENDS), help="Only the patches of this backend.")
@command
@quiet_ray
def status_cmd(out: Out, address: str | None, python: str | None, backend: str | None, **roots: Any) -> int:
    """Every node's trees, versions, patch states and records; names the nodes that differ (exit 8)."""
    args = ["status", *_tree_args(python, {p: roots.get(f"{p}_root") for p in ROOT_OPTIONS} | more_roots())]
    if backend:
        args += ["--backend", backend]
    reports = run_on(connect(address), args, python, out.progress, "status")
    refusal = missing_refusal(reports)
    if refusal:
        raise refusal
    reasons = disagreements(reports, targets=False)
    states = {
        n: tuple(sorted((t["package"], tuple(sorted(t["patches"].items()))) for t in r.get("trees", [])))
        for n, r in reports.items()
    }
    ref = _majority(states)
    for n, s in states.items():
        if s != ref and not reasons[n]:
            applied = {p for _, patches in s for p, st in patches if st == "applied"}
            reasons[n].append(
                "patch states differ from the other nodes'"
                + (
                    "; nothing applied here (a node that joined after `cluster apply`? run it again)"
                    if not applied
                    else ""
                )
            )
    targets = {n: tuple(sorted(t["target"] for t in r.get("trees", []))) for n, r in reports.items()}
    ref = _majority(targets)
    for n, t in targets.items():
        if t != ref and not reasons[n]:
            reasons[n].append("the same patches, but its recorded diffs differ from the other nodes' (other options?)")
    failed = _failures(reports)
    for n in failed:
        reasons[n].append(failed[n])
    bad = {n for n, why in reasons.items() if why}
    results = {n: ("differs" if n in bad else "agrees") for n in reports}
    if failed:
        code = int(next(r.get("code") or ExitCode.WRITE_FAILED for n, r in reports.items() if n in failed))
    else:
        code = int(ExitCode.NODES_DISAGREE if bad else ExitCode.OK)
    verdict = (
        f"all {len(reports)} node(s) agree"
        if not bad
        else (f"{len(bad)} of {len(reports)} node(s) differ from the others")
    )
    return emit(out, "status", reports, results, reasons, verdict, code)


@cluster.command("revert")
@cluster_options
@click.option("--merge", is_flag=True, help="Keep edits made after apply (three-way merge) instead of stopping.")
@command
@quiet_ray
def revert_cmd(out: Out, address: str | None, python: str | None, merge: bool, **roots: Any) -> int:
    """Revert every node; nothing is written unless every node can revert (dry run first)."""
    args = ["revert", *_tree_args(python, {p: roots.get(f"{p}_root") for p in ROOT_OPTIONS} | more_roots())]
    if merge:
        args.append("--merge")
    nodes = connect(address)
    checks = run_on(nodes, [*args, "--dry-run"], python, out.progress, "plan revert")
    refusal = missing_refusal(checks)
    if refusal:
        raise refusal
    nothing = {n for n, r in checks.items() if r.get("message", "").startswith("nothing recorded for")}
    failed = {n: why for n, why in _failures(checks).items() if n not in nothing}
    reasons: dict[str, list[str]] = {n: [] for n in checks}
    if failed:
        for n, why in failed.items():
            reasons[n].append(why)
            reasons[n] += [f"  {d.splitlines()[0]}" for d in (checks[n].get("document") or {}).get("details", [])]
        results = {n: "blocked" if n in failed else "can revert" for n in checks}
        code = int(next(checks[n].get("code") or ExitCode.REFUSED for n in failed))
        verdict = f"revert blocked on {len(failed)} node(s): nothing was written on any node"
        return emit(out, "revert", checks, results, reasons, verdict, code)
    todo = [n for n in nodes if n["NodeID"] not in nothing]
    reports = {**checks, **(run_on(todo, args, python, out.progress, "revert") if todo else {})}
    failed = {n: why for n, why in _failures(reports).items() if n not in nothing}
    results = {}
    for n, r in reports.items():
        ids = [i for t in (r.get("document") or {}).get("trees", []) for i in t.get("reverted", [])]
        recovered = [m for t in (r.get("document") or {}).get("trees", []) for m in t.get("recovered", [])]
        reasons[n] += [f"recovered: {m}" for m in recovered]
        if n in failed:
            results[n] = "FAILED"
            reasons[n].append(failed[n])
        else:
            results[n] = f"reverted {', '.join(ids)}" if ids else "nothing to revert"
    code = int(next((reports[n].get("code") or ExitCode.WRITE_FAILED for n in failed), ExitCode.OK))
    verdict = f"reverted on all {len(reports)} node(s)" if not failed else f"revert FAILED on {len(failed)} node(s)"
    return emit(out, "revert", reports, results, reasons, verdict, code)
