"""`rlprobe-patch status` and `forget`: every tree's patches and records; the registry of patched trees."""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path

import click

from rlprobe_patch.base.errors import ExitCode, RefusedError
from rlprobe_patch.catalogue.trees import BACKENDS
from rlprobe_patch.cli.options import tree_options
from rlprobe_patch.cli.output import Out, command, print_gone, print_notices, print_tree
from rlprobe_patch.core.roots import Roots
from rlprobe_patch.record.registry import forget_trees, registered_trees


@click.command("status")
@tree_options
@click.option("--backend", type=click.Choice(BACKENDS), help="Only the patches of this backend.")
@click.option("--prune", is_flag=True, help="Drop the registered trees that are gone from the registry.")
@command
def status_cmd(
    out: Out,
    roots: Roots,
    backend: str | None,
    prune: bool,
) -> int:
    """Per tree: path, version, every patch and its state (applied / applicable / drifted / native);
    every registered tree, those gone included."""
    from rlprobe_patch.core.rules import has_worker_paths
    from rlprobe_patch.core.status import status

    if not roots.given and roots.python is None and not registered_trees():
        roots.python = sys.executable  # nothing named or registered: what this Python imports
    trees = roots.for_records(all_gone_ok=True)
    results = [status(tree, backend, roots.trust_record) for tree in trees]
    pruned = forget_trees(roots.gone) if prune and roots.gone else []
    out.emit(
        {
            "ok": True,
            "trees": [
                {
                    "tree": r.tree.to_json(),
                    "patches": [p.to_json() for p in r.patches],
                    "records": [
                        {"id": rec.id, "patches": [asdict(p) for p in rec.patches], "backend": rec.backend}
                        for rec in r.records
                    ],
                    "superseded": [s.to_json() for s in r.superseded],
                    "recovered": r.recovered,
                    "worker_paths": r.worker_paths,
                    "pending_journal": r.pending_journal,
                }
                for r in results
            ],
            "gone": roots.gone,
            "pruned": pruned,
        }
    )
    for r in results:
        print_tree(out, r.tree)
        if has_worker_paths(r.tree.package):
            out.line(f"  worker path hooked: {', '.join(r.worker_paths) or 'none'}")
        for message in r.recovered:
            out.line(f"recovered: {message}", fg="yellow")
        for s in r.superseded:
            out.line(f"  record {s.record.id}: superseded, {s.reason}; the next apply or revert drops it", fg="yellow")
        recorded = {i for rec in r.records for i in rec.patch_ids}
        for p in r.patches:
            mark = " (recorded)" if p.patch.id in recorded else ""
            colour = {"applied": "green", "applicable": None, "drifted": "red"}.get(p.state_name, "yellow")
            shown = f"{p.revision_text}: `rlprobe-patch apply` upgrades it" if p.outdated else p.state_name
            out.line(f"  {p.patch.id:<28} {shown}{mark}", fg=colour)
            for text in (p.skipped, p.native, *p.reasons):
                if text:
                    out.line(f"      {text}")
        print_notices(out, r.patches)
    if prune:
        for g in pruned:
            out.line(f"{g['package']} at {g['root']}: gone, dropped from the registry", fg="yellow")
    else:
        print_gone(out, roots)
    return int(ExitCode.OK)


@click.command("forget")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@command
def forget_cmd(out: Out, paths: tuple[Path, ...]) -> int:
    """Drop trees (deleted, moved) from the registry that argument-less commands use; nothing else changes."""

    wanted = {str(p.expanduser().absolute()) for p in paths}
    # A root, or its package folder (as --verl-root accepts both).
    matches = [e for e in registered_trees() if {e["root"], str(Path(e["root"]) / e["package"])} & wanted]
    if not matches:
        raise RefusedError(
            f"not registered: {', '.join(sorted(wanted))}", hint="`rlprobe-patch status` lists the registered trees"
        )
    dropped = forget_trees(matches)
    named = {e["root"] for e in dropped} | {str(Path(e["root"]) / e["package"]) for e in dropped}
    unknown = sorted(w for w in wanted if w not in named)
    out.emit({"ok": True, "forgotten": dropped, "not_registered": unknown})
    for e in dropped:
        still = Path(e["root"], e["package"]).is_dir()
        note = " (the tree is still there: its record is kept; name it with its root option)" if still else ""
        out.line(f"forgot {e['package']} at {e['root']}{note}")
    for w in unknown:
        out.line(f"not registered: {w}", fg="yellow")
    return int(ExitCode.OK)
