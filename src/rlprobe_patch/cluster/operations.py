"""`cluster apply|verify|status|revert`: every node of a Ray cluster, as one transaction.

One Ray task per alive node, pinned to it (node affinity, not soft), runs the local command in
that node's environment (`node.run_local`). apply plans on every node first (`apply
--dry-run`: trees, versions, states, the hash of the diff) and writes nowhere unless all nodes
agree; then every node applies, and if one fails the nodes already written are reverted.
Ray is imported here only, and only when a cluster command runs. The commands themselves, and
the table they print, are in `cli/cluster.py`.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlprobe_patch.base.errors import ExitCode, RefusedError
from rlprobe_patch.catalogue.trees import ROOT_OPTIONS
from rlprobe_patch.cluster import node as node_task

Report = dict[str, Any]
Progress = Callable[[str], None]


@dataclass
class Outcome:
    """What a cluster command found: each node's report, result and reasons, the verdict, the exit code."""

    command: str
    reports: dict[str, Report]
    results: dict[str, str]
    reasons: dict[str, list[str]]
    verdict: str
    code: int


# -- reaching the nodes -----------------------------------------------------------------------
def disconnect() -> None:
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


def connect(address: str | None) -> list[dict[str, Any]]:
    """Join the Ray cluster at `address` (or RAY_ADDRESS, else `auto`); its alive nodes, head first."""
    try:
        import ray
    except ImportError:
        raise RefusedError(
            "Ray is not installed in this Python", hint="pip install 'rlprobe-patch[ray]' (the driver needs Ray)"
        ) from None
    address = address or os.environ.get("RAY_ADDRESS") or "auto"
    if address != "auto" and not ray.is_initialized():  # Ray waits minutes on a dead address: ask first
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
    ray.cloudpickle.register_pickle_by_value(node_task)  # type: ignore[no-untyped-call]  # nodes need not have rlprobe-patch
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

    task = ray.remote(num_cpus=0, max_retries=0)(node_task.run_local)
    pending = {}
    for each in nodes:
        node_id = each["NodeID"]
        strategy = NodeAffinitySchedulingStrategy(node_id, soft=False)
        pending[task.options(scheduling_strategy=strategy).remote(args, python, node_id, write)] = each
    reports: dict[str, Report] = {}
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        done = pending.pop(ready[0])
        try:
            report = ray.get(ready[0])
        except ray.exceptions.RayError as exc:  # the node (or its worker) died under the task
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            report = {"node_id": done["NodeID"], "lost": True, "code": None, "message": f"node lost: {first}"}
        report.setdefault("host", done.get("NodeManagerAddress", "?"))
        reports[done["NodeID"]] = report
        progress(f"node {short(done['NodeID'])} ({report['host']}): {what}: {outcome(report)}")
    return {n["NodeID"]: reports[n["NodeID"]] for n in nodes}


def short(node_id: str) -> str:
    return node_id[:8]


def outcome(report: Report) -> str:
    if report.get("lost"):
        return "LOST"
    if report.get("missing"):
        return "rlprobe-patch not importable"
    return "ok" if report.get("code") == 0 else f"exit {report.get('code')}: {report.get('message', '')}"


# -- agreement --------------------------------------------------------------------------------
def majority(values: dict[str, Any]) -> Any:
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
    ref = majority(tools)
    for n, v in tools.items():
        if v != ref:
            reasons[n].append(f"rlprobe-patch {v} here, {_others(tools, n)} elsewhere")
    trees = {n: {t["package"]: t for t in r.get("trees", [])} for n, r in reports.items()}
    for package in sorted({p for by in trees.values() for p in by}):
        versions = {n: by[package]["version"] if package in by else None for n, by in trees.items()}
        ref = majority(versions)
        for n, v in versions.items():
            if v != ref:
                here = f"{package} {v}" if v else f"no {package} tree"
                reasons[n].append(f"{here} here; elsewhere: {_others(versions, n, package)}")
        carried = {n: ", ".join(by[package].get("record_patches") or []) for n, by in trees.items() if package in by}
        ref_carried = majority(carried)
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
        target = majority(same) if same else None
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


def failures(reports: dict[str, Report], ok_codes: tuple[int, ...] = (0,)) -> dict[str, str]:
    failed = {}
    for n, r in reports.items():
        if r.get("lost") or r.get("missing") or r.get("code") not in ok_codes:
            failed[n] = r.get("message") or outcome(r)
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


# -- the operations (`args`: the local command each node runs, without --json) ------------------
def apply(
    address: str | None, python: str | None, args: list[str], tree_args: list[str], dry_run: bool, progress: Progress
) -> Outcome:
    """Plan on every node, refuse unless all agree, apply everywhere; roll back the others if one fails."""
    nodes = connect(address)
    progress(f"{len(nodes)} node(s); planning on each")
    plans = run_on(nodes, [*args, "--dry-run"], python, progress, "plan")
    refusal = missing_refusal(plans)
    if refusal:
        raise refusal
    interrupted = [n for n in nodes if any(t["journal"] for t in plans[n["NodeID"]].get("trees", []))]
    repaired: dict[str, str] = {}
    if interrupted:  # a write killed earlier: the local engine finishes it (status), then plan again
        status_args = ["status", *tree_args]
        for n, r in run_on(interrupted, status_args, python, progress, "finishing an interrupted write").items():
            done = [m for t in (r.get("document") or {}).get("trees", []) for m in t.get("recovered", [])]
            repaired[n] = "; ".join(done) or outcome(r)
        plans.update(run_on(interrupted, [*args, "--dry-run"], python, progress, "plan again"))
    reasons = disagreements(plans, records=True)
    for n, r in plans.items():
        if n in repaired:
            reasons[n].insert(0, f"recovered an interrupted write: {repaired[n]}")
        if r.get("lost") or r.get("code") != 0:
            reasons[n].append(f"refused: {r.get('message') or outcome(r)}")
            for detail in (r.get("document") or {}).get("details", []):
                reasons[n].append(f"  {detail}")
    blocking = {n for n, why in reasons.items() if any(not w.startswith("recovered") for w in why)}
    writers = [n for n in nodes if any(t["planned"] for t in plans[n["NodeID"]].get("trees", []))]
    if blocking:
        results = {
            n: ("refused" if plans[n].get("code") != 0 else "differs") if n in blocking else "agrees" for n in plans
        }
        verdict = f"nodes disagree or refuse ({len(blocking)} of {len(plans)}): nothing was written on any node"
        return Outcome("apply", plans, results, reasons, verdict, int(ExitCode.REFUSED))
    if dry_run or not writers:
        results = {n: ("would apply" if n in {w["NodeID"] for w in writers} else "already applied") for n in plans}
        verdict = (
            f"all {len(plans)} node(s) agree; dry run: nothing written"
            if dry_run
            else f"already applied on all {len(plans)} node(s): nothing written"
        )
        return Outcome("apply", plans, results, reasons, verdict, int(ExitCode.OK))
    progress(f"all {len(plans)} node(s) agree; applying on {len(writers)}")
    applied = run_on(writers, args, python, progress, "apply", write=True)
    for n, r in applied.items():  # a failed (or lost) node's trees are those it planned
        r["trees"] = r.get("trees") or plans[n].get("trees", [])
    reports = {**plans, **applied}
    failed = failures(applied)
    results = {n: ("applied" if n in applied else "already applied") for n in plans}
    if not failed:
        verdict = f"applied on all {len(plans)} node(s)"
        return Outcome("apply", reports, results, reasons, verdict, int(ExitCode.OK))
    # One node failed: revert every node this run wrote to, the failed ones too (revert finishes a kept journal).
    for n, why in failed.items():
        reasons[n].append(f"failed: {why}")
        results[n] = "LOST" if applied[n].get("lost") else "write failed"
    undo = [w for w in writers if not applied[w["NodeID"]].get("lost")]
    progress(f"{len(failed)} node(s) failed; rolling back {len(undo)}")
    rollback = {n["NodeID"]: _revert_exactly(n, plans[n["NodeID"]], python, progress) for n in undo}
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
        else f"ROLLBACK FAILED on {', '.join(short(n) for n in stuck)}: see their lines"
    )
    return Outcome("apply", reports, results, reasons, verdict, code)


def resolved_roots(report: Report) -> list[str]:
    """The roots a node's local command found, as options (for the rollback: exactly those trees)."""
    args: list[str] = []
    for tree in report.get("trees", []):
        if tree.get("package") in ROOT_OPTIONS:
            args += [ROOT_OPTIONS[tree["package"]], tree["root"]]
    return args


def _revert_exactly(node: dict[str, Any], plan: Report, python: str | None, progress: Progress) -> tuple[bool, str]:
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
        commands.append(["revert", *resolved_roots({"trees": unpatched})])
    done = []
    for args in commands:
        report = run_on([node], args, python, progress, "rollback")[node["NodeID"]]
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
            return False, f"rollback failed: {report.get('message') or outcome(report)}"
    return True, "rolled back: " + "; ".join(done)


def verify(address: str | None, python: str | None, args: list[str], progress: Progress) -> Outcome:
    """Verify every node; fails when one node fails or the nodes run different releases."""
    reports = run_on(connect(address), args, python, progress, "verify")
    refusal = missing_refusal(reports)
    if refusal:
        raise refusal
    reasons = disagreements(reports)
    failed = failures(reports)
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
    return Outcome("verify", reports, results, reasons, verdict, code)


def status(address: str | None, python: str | None, args: list[str], progress: Progress) -> Outcome:
    """Every node's trees, versions, patch states and records; names the nodes that differ (exit 8)."""
    reports = run_on(connect(address), args, python, progress, "status")
    refusal = missing_refusal(reports)
    if refusal:
        raise refusal
    reasons = disagreements(reports, targets=False)
    states = {
        n: tuple(sorted((t["package"], tuple(sorted(t["patches"].items()))) for t in r.get("trees", [])))
        for n, r in reports.items()
    }
    ref = majority(states)
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
    ref = majority(targets)
    for n, t in targets.items():
        if t != ref and not reasons[n]:
            reasons[n].append("the same patches, but its recorded diffs differ from the other nodes' (other options?)")
    failed = failures(reports)
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
    return Outcome("status", reports, results, reasons, verdict, code)


def revert(address: str | None, python: str | None, args: list[str], progress: Progress) -> Outcome:
    """Revert every node; nothing is written unless every node can revert (dry run first)."""
    nodes = connect(address)
    checks = run_on(nodes, [*args, "--dry-run"], python, progress, "plan revert")
    refusal = missing_refusal(checks)
    if refusal:
        raise refusal
    nothing = {n for n, r in checks.items() if r.get("message", "").startswith("nothing recorded for")}
    failed = {n: why for n, why in failures(checks).items() if n not in nothing}
    reasons: dict[str, list[str]] = {n: [] for n in checks}
    if failed:
        for n, why in failed.items():
            reasons[n].append(why)
            reasons[n] += [f"  {d.splitlines()[0]}" for d in (checks[n].get("document") or {}).get("details", [])]
        results = {n: "blocked" if n in failed else "can revert" for n in checks}
        code = int(next(checks[n].get("code") or ExitCode.REFUSED for n in failed))
        verdict = f"revert blocked on {len(failed)} node(s): nothing was written on any node"
        return Outcome("revert", checks, results, reasons, verdict, code)
    todo = [n for n in nodes if n["NodeID"] not in nothing]
    reports = {**checks, **(run_on(todo, args, python, progress, "revert") if todo else {})}
    failed = {n: why for n, why in failures(reports).items() if n not in nothing}
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
    return Outcome("revert", reports, results, reasons, verdict, code)
