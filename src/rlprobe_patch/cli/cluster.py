"""`rlprobe-patch cluster apply|verify|status|revert`: the commands, and the per-node table they print.

What each does on the nodes is `cluster.operations`; here the options (the same tree and apply
options as the local commands, plus `--address`) become the local command every node runs.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable
from typing import Any, TextIO

import click

from rlprobe_patch.catalogue.trees import BACKENDS, PATCH_MODES, ROOT_OPTIONS
from rlprobe_patch.cli.options import apply_options, tree_options
from rlprobe_patch.cli.output import Out, command
from rlprobe_patch.cluster import operations
from rlprobe_patch.cluster.operations import Outcome, disconnect, short
from rlprobe_patch.core.roots import Roots

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


def emit(out: Out, outcome: Outcome) -> int:
    """The per-node table (text) or one JSON document; returns the exit code."""

    disconnect()  # no more messages from Ray's threads
    with contextlib.redirect_stdout(_STDOUT[-1] if _STDOUT else sys.stdout):
        return _print(out, outcome)


def _print(out: Out, outcome: Outcome) -> int:

    command_name, reports, results, reasons = outcome.command, outcome.reports, outcome.results, outcome.reasons
    verdict, code = outcome.verdict, outcome.code
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
                f"{short(node['node_id']) if first else '':<9} {node['host'] if first else '':<15} "
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


def tree_args(roots: Roots) -> list[str]:
    """The tree options of the local command each node runs."""
    args = ["--python", roots.python] if roots.python else []
    for package, root in roots.given.items():
        args += [ROOT_OPTIONS[package], str(root)]
    return args + (["--trust-record"] if roots.trust_record else [])


def option_args(options: dict[str, Any]) -> list[str]:
    """Options given as the local command's flags (`--only A,B`, `--force`)."""
    args: list[str] = []
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value not in (None, False):
            args += [flag, str(value)]
    return args


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


@cluster.command("apply")
@cluster_options
@apply_options
@command
@quiet_ray
def apply_cmd(out: Out, address: str | None, roots: Roots, dry_run: bool, **options: Any) -> int:
    """Plan on every node, refuse unless all agree, apply everywhere; roll back the others if one fails."""

    trees = tree_args(roots)
    args = ["apply", *trees, *option_args(options)]
    return emit(out, operations.apply(address, roots.python, args, trees, dry_run, out.progress))


@cluster.command("verify")
@cluster_options
@click.option("--backend", type=click.Choice(BACKENDS), help="Also check this backend's hook.")
@click.option("--mode", type=click.Choice(PATCH_MODES), help="Also check this mode's patch set.")
@click.option("--script", metavar="PATH", help="The training script (same path on every node).")
@click.option("--recheck", is_flag=True, help="Parse every hooked file again.")
@command
@quiet_ray
def verify_cmd(out: Out, address: str | None, roots: Roots, **options: Any) -> int:
    """Verify every node; fails when one node fails or the nodes run different releases."""

    args = ["verify", *tree_args(roots), *option_args(options)]
    return emit(out, operations.verify(address, roots.python, args, out.progress))


@cluster.command("status")
@cluster_options
@click.option("--backend", type=click.Choice(BACKENDS), help="Only the patches of this backend.")
@command
@quiet_ray
def status_cmd(out: Out, address: str | None, roots: Roots, backend: str | None) -> int:
    """Every node's trees, versions, patch states and records; names the nodes that differ (exit 8)."""

    args = ["status", *tree_args(roots), *option_args({"backend": backend})]
    return emit(out, operations.status(address, roots.python, args, out.progress))


@cluster.command("revert")
@cluster_options
@click.option("--merge", is_flag=True, help="Keep edits made after apply (three-way merge) instead of stopping.")
@command
@quiet_ray
def revert_cmd(out: Out, address: str | None, roots: Roots, merge: bool) -> int:
    """Revert every node; nothing is written unless every node can revert (dry run first)."""

    args = ["revert", *tree_args(roots), *option_args({"merge": merge})]
    return emit(out, operations.revert(address, roots.python, args, out.progress))
