"""Integrity of a tree's record: its diff and its ledger against history.git.

A record folder lives in the tree, which other people may write: before a record is reversed
(revert, an upgrade) or trusted (verify), its diff must name exactly its files, inside the tree,
and every hash in ledger.json must match the blob history.git holds.
"""

from __future__ import annotations

from rlprobe_patch.base.diffs import diff_paths
from rlprobe_patch.base.errors import RefusedError
from rlprobe_patch.base.fsio import sha256
from rlprobe_patch.record.folder import Record, RecordFolder


def diff_problem(folder: RecordFolder, record: Record) -> str:
    """Why the record's diff cannot be trusted ("" when it can): missing, outside the tree, other files."""
    text = folder.read_diff(record.diff)
    if text is None:
        return f"{record.diff}: the diff file is missing"
    try:
        paths = diff_paths(text)
    except RefusedError as exc:
        return f"{record.diff}: {exc.message}"
    if sorted(paths) != sorted(f.path for f in record.files):
        return f"{record.diff}: the diff and the ledger name different files"
    return ""


def hash_problems(folder: RecordFolder, record: Record) -> list[str]:
    """Files whose hashes in ledger.json do not match the blobs history.git holds for them."""
    problems = []
    for f in record.files:
        for side, blob, want in (("before", f.before_blob, f.before), ("after", f.after_blob, f.after)):
            if not want and not blob:
                continue  # a file the patch added has no "before"
            try:
                ok = sha256(folder.history.read_blob(blob)) == want
            except Exception:  # not a blob id, or absent from history.git
                ok = False
            if not ok:
                problems.append(f"{f.path}: the {side} hash in ledger.json does not match history.git")
    return problems


def refuse_damaged(folder: RecordFolder, records: list[Record]) -> None:
    damaged = [p for r in records for p in [diff_problem(folder, r), *hash_problems(folder, r)] if p]
    if damaged:
        raise RefusedError(
            f"the record in {folder.path} does not match its history; nothing was written",
            details=damaged,
            hint="ledger.json or diffs/ were edited by hand or damaged: restore them, or reinstall the "
            "package and delete the folder",
        )
