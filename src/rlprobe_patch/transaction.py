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

from rlprobe_patch.errors import WriteFailedError
from rlprobe_patch.fsio import atomic_write, checkpoint, fsync_dir, remove_stale_temp_files
from rlprobe_patch.sites import digest, file_mode, read_or_none
from rlprobe_patch.state import Journal, StateDir
from rlprobe_patch.state_registry import register_tree


def run_journal(state: StateDir, journal: Journal) -> None:
    """Write the journal, then carry it out. `recover` carries out one left by a killed run."""
    checkpoint("journal")
    state.write_journal(journal)
    carry_out(state, journal)


def carry_out(state: StateDir, journal: Journal) -> list[str]:
    problems = []
    for f in journal.files:
        path = state.root / f.path
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
            atomic_write(path, state.read_blob(f.blob), f.mode)
        else:  # a file the write removes (the revert of a file a patch added)
            path.unlink()
            fsync_dir(path.parent)
    checkpoint("ledger")
    state.write_ledger(journal.ledger)
    recorded = {r.package for r in journal.ledger.records}
    for package, commit in journal.branches.items():
        state.set_branch(package, commit)
        register_tree(state.root, package, present=package in recorded)
    checkpoint("clear journal")
    state.clear_journal()
    return problems


@contextlib.contextmanager
def write_phase(state: StateDir, what: str) -> Iterator[None]:
    """A write the disk refuses (full, I/O error) ends the command cleanly, saying what the tree holds."""
    try:
        yield
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if state.read_journal() is not None:
            raise WriteFailedError(
                f"{what} stopped: {reason}; each file is original or patched, and {state.journal_path} "
                "records the rest",
                hint="free space, then run `rlprobe-patch status` (or any command on the tree) to finish it",
            ) from None
        raise WriteFailedError(
            f"{what} stopped: {reason}; nothing in the tree was changed",
            hint="free space and run the command again",
        ) from None


def recover(state: StateDir) -> list[str]:
    """Finish a write that a killed or interrupted run left half done; say what was done."""
    journal = state.read_journal()
    if journal is None:
        return []
    problems = carry_out(state, journal)
    return [f"found an interrupted {journal.op} (record {journal.record}) and completed it", *problems]
