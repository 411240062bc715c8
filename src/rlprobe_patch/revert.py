"""Revert: restore, byte for byte, what the live records of a tree changed; never lose a later edit.

A file edited after apply stops the revert and shows the edit (exit 5, nothing written);
`merge` keeps the edit and removes only the patch (three-way, `git merge-file`). A record
superseded by an upgrade of the package (records.py) is dropped from the ledger, its files
untouched. An upgrade of a patch's revision (`apply`) plans the reversal of its record here.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rlprobe_patch.diffs import unified_diff
from rlprobe_patch.errors import PatchError, RefusedError, RevertBlockedError
from rlprobe_patch.gitsafe import run_git
from rlprobe_patch.records import Superseded, superseded_reason
from rlprobe_patch.sites import digest, read_or_none
from rlprobe_patch.state import Journal, JournalFile, Ledger, Record, StateDir
from rlprobe_patch.transaction import recover, run_journal, write_phase
from rlprobe_patch.trees import Tree, find_tree
from rlprobe_patch.verify import diff_problem, hash_problems

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


@dataclass(frozen=True)
class RevertTarget:
    """One file a revert sets: from `current` to `reverted` (None: absent), `blob` holding `reverted`."""

    current: bytes | None
    reverted: bytes | None
    mode: int
    blob: str


@dataclass
class RevertPlan:
    """The content of each file once `records` are reversed (LIFO), and the files merged to get it."""

    contents: dict[str, tuple[bytes | None, int]]  # path -> (content after the reversal, mode)
    current: dict[str, bytes | None]  # path -> what the tree holds now
    merged: list[str] = field(default_factory=list)

    def targets(self, state: StateDir) -> dict[str, RevertTarget]:
        """The files the reversal changes, their new content stored as blobs."""
        found = {}
        for rel, (new, mode) in self.contents.items():
            if new != self.current[rel]:
                found[rel] = RevertTarget(self.current[rel], new, mode, "" if new is None else state.store_blob(new))
        return found


def plan_reversal(
    state: StateDir, records: list[Record], merge: bool, what: str = "revert", hint: str = ""
) -> RevertPlan:
    """Reverse `records` (given oldest first) in memory; refuses (RevertBlockedError) on edits made
    after apply unless `merge`, and on edits that overlap the patch even then."""
    current: dict[str, bytes | None] = {}
    result: dict[str, bytes | None] = {}
    modes: dict[str, int] = {}
    merged: list[str] = []
    blocked: list[str] = []
    for record in reversed(records):
        for f in record.files:
            path = state.root / f.path
            if f.path not in result:
                current[f.path] = result[f.path] = read_or_none(path)
                if current[f.path] is None and f.before:
                    blocked.append(f"{f.path}: deleted after apply; reinstall the package to restore it")
                    continue
            data = result[f.path]
            modes[f.path] = f.mode
            if digest(data) == f.after:
                result[f.path] = state.read_blob(f.before_blob) if f.before else None
            elif digest(data) == f.before:
                continue  # already reverted by hand
            else:
                assert data is not None
                patched = state.read_blob(f.after_blob)
                edit = unified_diff({f.path: (patched, data)})
                if not merge or not f.before:
                    why = "edited after apply" if f.before else "a file this patch added, edited after apply"
                    blocked.append(f"{f.path}: {why}; your edit (patched -> now):\n{edit}")
                    continue
                ok, out = merge3(data, patched, state.read_blob(f.before_blob))
                if not ok:
                    blocked.append(f"{f.path}: your edit overlaps the patch; cannot merge it. Your edit:\n{edit}")
                    continue
                result[f.path] = out
                merged.append(f.path)
    if blocked:
        raise RevertBlockedError(
            f"{what} stopped: a patched file changed after apply; nothing was written",
            details=blocked,
            hint=hint
            or ("" if merge else "rerun with --merge to keep your edits and remove only the patch (three-way merge)"),
        )
    return RevertPlan({rel: (new, modes[rel]) for rel, new in result.items()}, current, merged)


def merge3(current: bytes, base: bytes, other: bytes) -> tuple[bool, bytes]:
    """Apply base->other onto current (git merge-file); ok is False on conflicts."""
    with tempfile.TemporaryDirectory(prefix="rlprobe-merge-") as tmp:
        paths = []
        for name, data in (("current", current), ("patched", base), ("original", other)):
            p = Path(tmp, name)
            p.write_bytes(data)
            paths.append(str(p))
        proc = run_git(["merge-file", "-p", *paths])
    return proc.returncode == 0, proc.stdout


def refuse_damaged(state: StateDir, records: list[Record]) -> None:
    damaged = [p for r in records for p in [diff_problem(state, r), *hash_problems(state, r)] if p]
    if damaged:
        raise RefusedError(
            f"the record in {state.path} does not match its history; nothing was written",
            details=damaged,
            hint="ledger.json or diffs/ were edited by hand or damaged: restore them, or reinstall the "
            "package and delete the folder",
        )


def superseded_at(root: Path, ledger: Ledger, tree: Tree | None) -> list[Superseded]:
    """The records at `root` whose package was replaced by another release since apply."""
    trees: dict[str, Tree | None] = {}
    found = []
    for record in ledger.records:
        if record.package not in trees:
            if tree is not None and tree.package == record.package and tree.root == root:
                trees[record.package] = tree
            else:
                try:
                    trees[record.package] = find_tree(record.package, root)
                except PatchError:
                    trees[record.package] = None  # gone: its files are reported as deleted
        here = trees[record.package]
        reason = superseded_reason(here, record) if here is not None else ""
        if reason:
            found.append(Superseded(record, reason))
    return found


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
    state = StateDir(root, trust_record)
    if not state.exists():
        raise RefusedError(f"nothing recorded for {root}: no patch of rlprobe-patch to revert")
    with state.lock(lock_timeout), write_phase(state, f"revert of {root}"):
        recovered = [] if dry_run else recover(state)
        ledger = state.read_ledger()
        moved_from = ledger.root if ledger.records and ledger.root != str(root) else ""
        if not ledger.records:
            return RevertResult(tree, root, [], [], [], recovered, dry_run, "")
        superseded = superseded_at(root, ledger, tree)
        live = ledger.without({s.record.id for s in superseded}).records
        refuse_damaged(state, live)
        progress(f"planning the revert of {len(live)} record(s)")
        reversal = plan_reversal(state, live, merge)
        targets = reversal.targets(state)
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
            branches[package] = state.commit_files(tree_files, message, state.branch_head(package))
        for s in superseded:  # dropped: its package is unregistered with the rest
            head = state.branch_head(s.record.package)
            if head is not None:
                branches.setdefault(s.record.package, head)
        files = tuple(
            JournalFile(rel, t.mode, digest(t.current), digest(t.reverted), t.blob)
            for rel, t in sorted(targets.items())
        )
        progress(f"writing {len(files)} file(s)")
        ids = [r.id for r in reverted] + [s.record.id for s in superseded]
        state.write_undo(None)
        run_journal(state, Journal("revert", ",".join(ids), files, Ledger(root=str(root)), branches))
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
    state = StateDir(root, trust_record)
    with state.lock(lock_timeout), write_phase(state, f"undo of the newest apply on {root}"):
        recovered = recover(state)
        ledger = state.read_ledger()
        result = RevertResult(None, root, [], [], [], recovered, False, "")
        if [r.id for r in ledger.records] == records:
            return result
        undo = state.read_undo()
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
        run_journal(state, undo)
        state.write_undo(None)
    return RevertResult(None, root, [newest], sorted(f.path for f in undo.files), [], recovered, False, "")
