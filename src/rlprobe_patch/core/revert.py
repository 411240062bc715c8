"""Revert: restore, byte for byte, what the live records of a tree changed; never lose a later edit.

A file edited after apply stops the revert and shows the edit (exit 5, nothing written);
`merge` keeps the edit and removes only the patch (three-way, `git merge-file`). A record
superseded by an upgrade of the package (`record.sorting`) is dropped from the ledger, its files
untouched. An upgrade of a patch's revision (`apply`) plans the reversal of its record here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlprobe_patch.base.diffs import unified_diff
from rlprobe_patch.base.errors import RefusedError, RevertBlockedError
from rlprobe_patch.base.fsio import digest, read_or_none
from rlprobe_patch.catalogue.trees import Tree
from rlprobe_patch.core.roots import Roots
from rlprobe_patch.record.folder import Journal, JournalFile, Ledger, Record, RecordFolder
from rlprobe_patch.record.integrity import refuse_damaged
from rlprobe_patch.record.reversal import plan_reversal
from rlprobe_patch.record.sorting import Superseded, superseded_at
from rlprobe_patch.record.transaction import recover, run_journal, write_phase

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


@dataclass
class RevertResult:
    tree: Tree | None
    root: Path
    reverted: list[Record]
    files: list[str]
    merged: list[str]
    recovered: list[str]
    dry_run: bool
    diff: str
    moved_from: str = ""  # the root the record names, when the tree was moved after apply
    superseded: list[Superseded] = field(default_factory=list)  # dropped, files untouched

    def to_json(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "reverted": [rec.id for rec in self.reverted],
            "files": self.files,
            "merged": self.merged,
            "recovered": self.recovered,
            "dry_run": self.dry_run,
            "diff": self.diff if self.dry_run else None,
            "moved_from": self.moved_from or None,
            "superseded": [s.to_json() for s in self.superseded],
        }


@dataclass
class Reverted:
    """`revert_many`'s answer: each record folder's revert, and the registered trees that are gone."""

    results: list[RevertResult]
    gone: list[dict[str, str]]

    def to_json(self) -> dict[str, Any]:
        return {"ok": True, "trees": [r.to_json() for r in self.results], "gone": self.gone}


def revert_many(
    roots: Roots,
    *,
    merge: bool = False,
    dry_run: bool = False,
    records: list[str] | None = None,
    lock_timeout: float = 10.0,
    progress: Progress = _quiet,
) -> Reverted:
    """Revert every record folder of the trees `roots` names (else finds; trees sharing a root share one record,
    and of several roots those with a record), or with `records` (`--back-to`) undo the newest apply of one tree
    back to exactly those records (refused with several trees, `merge` or `dry_run`)."""
    trees = roots.for_records()
    paths = list(dict.fromkeys(t.root for t in trees))  # trees sharing a root (site-packages) share one record
    if len(paths) > 1:
        paths = [r for r in paths if RecordFolder(r).exists()] or paths[:1]
    if records is not None and (merge or dry_run or len(paths) > 1):
        raise RefusedError(
            "--back-to undoes the newest apply of one tree as it was written: one tree, no --merge, no --dry-run"
        )
    if records is not None:
        undone = back_to(
            paths[0], records, lock_timeout=lock_timeout, progress=progress, trust_record=roots.trust_record
        )
        return Reverted([undone], roots.gone)
    results = [
        revert(
            root,
            next(t for t in trees if t.root == root),
            merge=merge,
            dry_run=dry_run,
            lock_timeout=lock_timeout,
            progress=progress,
            trust_record=roots.trust_record,
        )
        for root in paths
    ]
    return Reverted(results, roots.gone)


def revert(
    root: Path,
    tree: Tree | None = None,
    *,
    merge: bool = False,
    dry_run: bool = False,
    lock_timeout: float = 10.0,
    progress: Progress = _quiet,
    trust_record: bool = False,
) -> RevertResult:
    folder = RecordFolder(root, trust_record)
    if not folder.exists():
        raise RefusedError(f"nothing recorded for {root}: no patch of rlprobe-patch to revert")
    with folder.lock(lock_timeout), write_phase(folder, f"revert of {root}"):
        recovered = [] if dry_run else recover(folder)
        ledger = folder.read_ledger()
        moved_from = ledger.root if ledger.records and ledger.root != str(root) else ""
        if not ledger.records:
            return RevertResult(tree, root, [], [], [], recovered, dry_run, "")
        superseded = superseded_at(root, ledger, tree)
        live = ledger.without({s.record.id for s in superseded}).records
        refuse_damaged(folder, live)
        progress(f"planning the revert of {len(live)} record(s)")
        reversal = plan_reversal(folder, live, merge)
        targets = reversal.targets(folder)
        diff = unified_diff({rel: (t.current, t.reverted) for rel, t in targets.items()})
        reverted = list(reversed(live))
        result = RevertResult(
            tree, root, reverted, sorted(targets), reversal.merged, recovered, dry_run, diff, moved_from, superseded
        )
        if dry_run:
            return result
        branches = {}
        for package in sorted({r.package for r in live}):
            package_files = {path for r in live if r.package == package for path in r.paths}
            tree_files = {rel: (t.blob, t.mode) for rel, t in targets.items() if t.blob and rel in package_files}
            message = f"rlprobe-patch revert {', '.join(r.id for r in reverted if r.package == package)}"
            branches[package] = folder.history.commit_files(tree_files, message, folder.history.branch_head(package))
        for s in superseded:  # dropped: its package is unregistered with the rest
            head = folder.history.branch_head(s.record.package)
            if head is not None:
                branches.setdefault(s.record.package, head)
        files = tuple(
            JournalFile(rel, t.mode, digest(t.current), digest(t.reverted), t.blob)
            for rel, t in sorted(targets.items())
        )
        progress(f"writing {len(files)} file(s)")
        ids = [r.id for r in reverted] + [s.record.id for s in superseded]
        folder.write_undo(None)
        run_journal(folder, Journal("revert", ",".join(ids), files, Ledger(root=str(root)), branches))
    return result


def back_to(
    root: Path,
    records: list[str],
    *,
    lock_timeout: float = 10.0,
    progress: Progress = _quiet,
    trust_record: bool = False,
) -> RevertResult:
    """Take the tree back to exactly the ledger of `records` (ids, oldest first) by undoing the
    newest apply (`undo.json`): what `cluster apply`'s rollback does on a tree it upgraded.

    Nothing to do when the ledger already holds exactly `records` (the apply never landed).
    Refused when the newest apply is not the one that followed them, or when a file it wrote
    changed since (exit 5, nothing written)."""
    folder = RecordFolder(root, trust_record)
    with folder.lock(lock_timeout), write_phase(folder, f"undo of the newest apply on {root}"):
        recovered = recover(folder)
        ledger = folder.read_ledger()
        result = RevertResult(None, root, [], [], [], recovered, False, "")
        if [r.id for r in ledger.records] == records:
            return result
        undo = folder.read_undo()
        newest = ledger.records[-1] if ledger.records else None
        if undo is None or newest is None or undo.record != newest.id or [r.id for r in undo.ledger.records] != records:
            raise RefusedError(
                f"{root}: the newest apply does not follow records {', '.join(records) or '(none)'}; "
                "nothing was written",
                details=[f"records now: {', '.join(r.id for r in ledger.records) or '(none)'}"],
                hint="`rlprobe-patch revert` takes every record back to the original files",
            )
        edited = [f.path for f in undo.files if digest(read_or_none(root / f.path)) != f.before]
        if edited:
            raise RevertBlockedError(
                f"undo of {newest.id} stopped: a file it wrote changed since; nothing was written",
                details=edited,
                hint="`rlprobe-patch revert` shows the edit (and --merge keeps it)",
            )
        progress(f"undoing {newest.id}: writing {len(undo.files)} file(s)")
        run_journal(folder, undo)
        folder.write_undo(None)
    return RevertResult(None, root, [newest], sorted(f.path for f in undo.files), [], recovered, False, "")
