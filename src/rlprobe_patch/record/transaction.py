"""Journaled writes: what apply and revert write, in an order a kill at any point survives.

    blobs + commits in history.git, the diff file   (nothing in the tree yet)
    journal.json                                    (what the tree must become)
    each target file: temp + fsync + rename          (modes kept)
    ledger.json, branches, registry
    journal.json removed

A run killed at any point leaves every file either as it was or as the journal wants it; the
next run finds the journal, finishes the job (`recover`) and says so.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from rlprobe_patch.base.errors import WriteFailedError
from rlprobe_patch.base.fsio import (
    atomic_write,
    checkpoint,
    digest,
    file_mode,
    fsync_dir,
    read_or_none,
    remove_stale_temp_files,
)
from rlprobe_patch.record.folder import Journal, RecordFolder
from rlprobe_patch.record.registry import register_tree


def run_journal(folder: RecordFolder, journal: Journal) -> None:
    """Write the journal, then carry it out. `recover` carries out one left by a killed run."""
    checkpoint("journal")
    folder.write_journal(journal)
    carry_out(folder, journal)


def carry_out(folder: RecordFolder, journal: Journal) -> list[str]:
    problems = []
    for f in journal.files:
        path = folder.root / f.path
        remove_stale_temp_files(path)
        current = digest(read_or_none(path))
        if current == f.after:
            if f.after and file_mode(path) != f.mode:
                os.chmod(path, f.mode)
            continue
        if current != f.before:
            problems.append(f"{f.path}: changed by someone else during the interrupted run; left as it is")
            continue
        checkpoint(f"write {f.path}")
        if f.blob:
            atomic_write(path, folder.history.read_blob(f.blob), f.mode)
        else:  # a file the write removes (the revert of a file a patch added)
            path.unlink()
            fsync_dir(path.parent)
    checkpoint("ledger")
    folder.write_ledger(journal.ledger)
    recorded = {r.package for r in journal.ledger.records}
    for package, commit in journal.branches.items():
        folder.history.set_branch(package, commit)
        register_tree(folder.root, package, present=package in recorded)
    checkpoint("clear journal")
    folder.clear_journal()
    return problems


@contextlib.contextmanager
def write_phase(folder: RecordFolder, what: str) -> Iterator[None]:
    """A write the disk refuses (full, I/O error) ends the command cleanly, saying what the tree holds."""
    try:
        yield
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if folder.read_journal() is not None:
            raise WriteFailedError(
                f"{what} stopped: {reason}; each file is original or patched, and {folder.journal_path} "
                "records the rest",
                hint="free space, then run `rlprobe-patch status` (or any command on the tree) to finish it",
            ) from None
        raise WriteFailedError(
            f"{what} stopped: {reason}; nothing in the tree was changed",
            hint="free space and run the command again",
        ) from None


def recover(folder: RecordFolder) -> list[str]:
    """Finish a write that a killed or interrupted run left half done; say what was done."""
    journal = folder.read_journal()
    if journal is None:
        return []
    problems = carry_out(folder, journal)
    return [f"found an interrupted {journal.op} (record {journal.record}) and completed it", *problems]
