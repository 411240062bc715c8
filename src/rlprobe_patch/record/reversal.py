"""Reversal: the content of each file once a tree's records are reversed, decided in memory.

`revert` writes it; an upgrade of a patch's revision (`apply`) starts its plan from it. Records
are reversed newest first; a file edited after apply stops the reversal (RevertBlockedError,
showing the edit) unless `merge`, which keeps the edit and removes only the patch (three-way,
`git merge-file`).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from rlprobe_patch.base.diffs import unified_diff
from rlprobe_patch.base.errors import RevertBlockedError
from rlprobe_patch.base.fsio import digest, read_or_none
from rlprobe_patch.base.gitsafe import run_git
from rlprobe_patch.record.folder import Record, RecordFolder


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

    def targets(self, folder: RecordFolder) -> dict[str, RevertTarget]:
        """The files the reversal changes, their new content stored as blobs."""
        found = {}
        for rel, (new, mode) in self.contents.items():
            if new != self.current[rel]:
                found[rel] = RevertTarget(
                    self.current[rel], new, mode, "" if new is None else folder.history.store_blob(new)
                )
        return found


def plan_reversal(
    folder: RecordFolder, records: list[Record], merge: bool, what: str = "revert", hint: str = ""
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
            path = folder.root / f.path
            if f.path not in result:
                current[f.path] = result[f.path] = read_or_none(path)
                if current[f.path] is None and f.before:
                    blocked.append(f"{f.path}: deleted after apply; reinstall the package to restore it")
                    continue
            data = result[f.path]
            modes[f.path] = f.mode
            if digest(data) == f.after:
                result[f.path] = folder.history.read_blob(f.before_blob) if f.before else None
            elif digest(data) == f.before:
                continue  # already reverted by hand
            else:
                assert data is not None
                patched = folder.history.read_blob(f.after_blob)
                edit = unified_diff({f.path: (patched, data)})
                if not merge or not f.before:
                    why = "edited after apply" if f.before else "a file this patch added, edited after apply"
                    blocked.append(f"{f.path}: {why}; your edit (patched -> now):\n{edit}")
                    continue
                ok, out = merge3(data, patched, folder.history.read_blob(f.before_blob))
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
