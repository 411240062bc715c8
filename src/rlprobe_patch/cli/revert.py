"""`rlprobe-patch revert`: restore, byte for byte, what apply changed; never destroy a later edit."""

from __future__ import annotations

import click

from rlprobe_patch.base.errors import ExitCode, RefusedError
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
    from rlprobe_patch.core.revert import back_to as undo_newest
    from rlprobe_patch.core.revert import revert
    from rlprobe_patch.record.folder import RecordFolder

    trees = roots.for_records()
    paths = list(dict.fromkeys(t.root for t in trees))  # trees sharing a root (site-packages) share one record
    if len(paths) > 1:
        paths = [r for r in paths if RecordFolder(r).exists()] or paths[:1]
    if back_to is not None and (merge or dry_run or len(paths) > 1):
        raise RefusedError(
            "--back-to undoes the newest apply of one tree as it was written: one tree, no --merge, no --dry-run"
        )
    if back_to is not None:
        ids = [i for i in back_to.split(",") if i]
        results = [
            undo_newest(
                paths[0], ids, lock_timeout=lock_timeout, progress=out.progress, trust_record=roots.trust_record
            )
        ]
    else:
        results = [
            revert(
                root,
                next(t for t in trees if t.root == root),
                merge=merge,
                dry_run=dry_run,
                lock_timeout=lock_timeout,
                progress=out.progress,
                trust_record=roots.trust_record,
            )
            for root in paths
        ]
    out.emit(
        {
            "ok": True,
            "trees": [
                {
                    "root": str(r.root),
                    "reverted": [rec.id for rec in r.reverted],
                    "files": r.files,
                    "merged": r.merged,
                    "recovered": r.recovered,
                    "dry_run": r.dry_run,
                    "diff": r.diff if r.dry_run else None,
                    "moved_from": r.moved_from or None,
                    "superseded": [s.to_json() for s in r.superseded],
                }
                for r in results
            ],
            "gone": roots.gone,
        }
    )
    for r in results:
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
