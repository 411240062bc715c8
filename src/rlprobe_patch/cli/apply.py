"""`rlprobe-patch apply`: patch the trees named (or found), each change a recorded, revertible diff."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.cli.options import apply_options, lock_timeout_option, read_options, reader_options, tree_options
from rlprobe_patch.cli.output import Out, command, parse_ids, print_notices, print_tree
from rlprobe_patch.core.roots import Roots

if TYPE_CHECKING:
    from rlprobe_patch.core.apply import TreeApplied


@click.command("apply")
@tree_options
@apply_options
@reader_options
@click.option(
    "--merge",
    is_flag=True,
    help="Upgrading a patch applied at an older revision: keep edits made to its files since (three-way merge) "
    "instead of stopping.",
)
@lock_timeout_option
@command
def apply_cmd(
    out: Out,
    roots: Roots,
    backend: str | None,
    mode: str | None,
    only: str | None,
    skip: str | None,
    dry_run: bool,
    force: bool,
    worker_impl: str,
    script: Path | None,
    msprobe_config: str | None,
    sglang_config: str | None,
    merge: bool,
    lock_timeout: float,
    **reader: Any,
) -> int:
    """Patch verl (engine of BACKEND, or a mode's set), SGLang and vLLM-Ascend; each change a revertible diff."""
    from rlprobe_patch.core.apply import ApplyRequest, apply_many
    from rlprobe_patch.launch.script import read_run_facts

    params = {k: v for k, v in (("msprobe_config", msprobe_config), ("sglang_config", sglang_config)) if v}
    request = ApplyRequest(
        backend,
        mode,
        parse_ids(only),
        parse_ids(skip),
        worker_impl,
        script,
        params,
        force,
        dry_run,
        merge,
        lock_timeout,
    )
    reading = read_options(dict(reader))
    read_facts = (lambda tree: read_run_facts(script, tree, reading)) if script is not None else None
    applied = apply_many(roots, request, read_facts, out.progress)
    out.emit(applied.to_json())
    for note in applied.notes:
        out.line(f"note: {note}", fg="yellow")
    for one in applied.trees:
        _print_tree_applied(out, one, dry_run)
    follow = applied.next_commands
    if follow is not None:
        out.line(f"next: {shlex.join(follow['verify'])}  # undo: {shlex.join(follow['revert'])}")
    return int(ExitCode.OK)


def _print_tree_applied(out: Out, one: TreeApplied, dry_run: bool) -> None:
    result, plan = one.result, one.result.plan
    print_tree(out, one.tree)
    if one.worker_path:
        out.line(f"worker path hooked: {one.worker_path['impl']} ({one.worker_path['why']})")
    for message in result.recovered:
        out.line(f"recovered: {message}", fg="yellow")
    for s in plan.superseded:
        word = "drops" if dry_run else "dropped"
        out.line(f"{word} record {s.record.id}: superseded, {s.reason}; no file touched", fg="yellow")
    for p in plan.patches:
        after = {"applicable": "would apply" if dry_run else "applied", "applied": "already applied"}
        word = after.get(p.state_name, p.state_name)
        if p in plan.upgraded:
            word = f"{'would upgrade' if dry_run else 'upgraded'} r{p.recorded_revision} -> r{p.patch.revision}"
        out.line(f"  {p.patch.id:<28} {word:<20} {', '.join(p.targets)}")
        for text in (p.skipped, p.native):
            if text:
                out.line(f"      {text}", fg="yellow")
    print_notices(out, plan.patches)
    for path in plan.merged:
        out.line(f"  kept your edits in {path} (three-way merge)", fg="yellow")
    skipped = [p.patch.id for p in plan.patches if p.skipped]
    if skipped:
        still = [p.patch.id for p in plan.patches if not p.skipped and not p.native]
        out.line(f"not for this release: {', '.join(skipped)}; in place: {', '.join(still)}", fg="yellow")
    if dry_run:
        out.line(result.diff or "(no change)")
    elif result.already_applied:
        out.line(
            "already applied: nothing written" if any(p.state for p in plan.patches) else "nothing to write",
            fg="green",
        )
    elif result.record is None:
        out.line("record(s) dropped: no file written", fg="green")
    else:
        for path, added, removed in result.diffstat:
            out.line(f"  {path} | +{added} -{removed}")
        if plan.replaces:
            out.line(f"replaces record(s) {', '.join(r.id for r in plan.replaces)}", fg="green")
        out.line(f"recorded: {one.diff_file}", fg="green")
