"""`rlprobe-patch revert`: restore, byte for byte, what apply changed; never destroy a later edit."""

from __future__ import annotations

import click

from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.cli.options import lock_timeout_option, tree_options
from rlprobe_patch.cli.output import Out, command, print_gone
from rlprobe_patch.core.roots import Roots


@click.command("revert")
@tree_options
@click.option("--merge", is_flag=True, help="Keep edits made after apply (three-way merge) instead of stopping.")
@click.option("--dry-run", is_flag=True, help="Print what revert would write; write nothing.")
@click.option(
    "--back-to",
    metavar="RECORD[,RECORD]",
    help="Only undo the newest apply, back to exactly these records (cluster apply's rollback of an upgrade).",
)
@lock_timeout_option
@command
def revert_cmd(
    out: Out,
    roots: Roots,
    merge: bool,
    dry_run: bool,
    back_to: str | None,
    lock_timeout: float,
) -> int:
    """Restore, byte for byte, what apply changed; never destroys later edits."""
    from rlprobe_patch.core.revert import revert_many

    records = None if back_to is None else [i for i in back_to.split(",") if i]
    reverted = revert_many(
        roots, merge=merge, dry_run=dry_run, records=records, lock_timeout=lock_timeout, progress=out.progress
    )
    out.emit(reverted.to_json())
    for r in reverted.results:
        out.line(f"{r.root}", bold=True)
        if r.moved_from:
            out.line(f"notice: the record names {r.moved_from}; the tree moved here after apply", fg="yellow")
        for message in r.recovered:
            out.line(f"recovered: {message}", fg="yellow")
        for s in r.superseded:
            word = "would drop" if r.dry_run else "dropped"
            out.line(f"  {word} record {s.record.id}: superseded, {s.reason}; no file touched", fg="yellow")
        if not r.reverted:
            out.line("  nothing applied: nothing to revert")
            continue
        if r.dry_run:
            out.line(r.diff)
            continue
        for rec in r.reverted:
            out.line(f"  reverted {', '.join(rec.patch_ids)} (record {rec.id})", fg="green")
        for path in r.merged:
            out.line(f"  kept your edits in {path} (three-way merge)", fg="yellow")
    print_gone(out, roots)
    return int(ExitCode.OK)
