"""Where rlprobe-patch keeps what it did to a tree, found from the tree alone.

    <root>/.rlprobe-patch/
        .gitignore      "*": the user's own git never sees this folder
        README.txt      what this folder is
        lock            held by apply and revert (one writer at a time)
        ledger.json     the records of what is applied (readable, hand-inspectable)
        journal.json    only while a write is in flight: what to finish after a crash
        undo.json       how to undo the newest apply, when the tree had records before it
        diffs/<id>.diff the unified diff of each apply, with its provenance header
        history.git/    a bare git repository: per record, a commit of the original files
                        and a commit of the patched files on branch <package>; reverts too

Nothing is ever committed into a repository of the user's. A registry in the user's state
folder lists the patched trees so that `verify` and `revert` work with no arguments.

What is in it: the ledger and journals (`ledger.py`, with their checked loader), history.git (`history.py`), and
the checks that refuse a folder someone else could have planted (`trust.py`).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

from rlprobe_patch.base.errors import RefusedError, WriteFailedError
from rlprobe_patch.base.fsio import atomic_write, create_new, dump_json, locked, remove_stale_temp_files, sha256
from rlprobe_patch.record.history import History
from rlprobe_patch.record.ledger import (
    FileRecord,
    Journal,
    JournalFile,
    Ledger,
    PatchRef,
    Record,
    journal_paths_outside,
    load_journal,
    load_ledger,
    outside_tree,
)
from rlprobe_patch.record.registry import check_state_folder
from rlprobe_patch.record.trust import TRUST_HINT, foreign_owners, layout_problems

__all__ = [
    "CHECKED_LIMIT",
    "RECORD_FOLDER_NAME",
    "FileRecord",
    "Journal",
    "JournalFile",
    "Ledger",
    "PatchRef",
    "Record",
    "RecordFolder",
    "checked_key",
]

RECORD_FOLDER_NAME = ".rlprobe-patch"
_README = """This folder was written by rlprobe-patch. It records the patches applied to the
package trees beside it, so that `rlprobe-patch verify`, `status` and `revert` work.
Do not edit it by hand; `rlprobe-patch revert` removes the patches and keeps this history.
Inspect it with: git --git-dir history.git log --stat --all ; cat ledger.json
"""


CHECKED_LIMIT = 4096


def checked_key(patch_id: str, target: str, fingerprint: str, data: bytes) -> str:
    return f"{patch_id}|{target}|{fingerprint}|{sha256(data)}"


class RecordFolder:
    def __init__(self, root: Path, trust_record: bool = False) -> None:
        self.root = root
        self.path = root / RECORD_FOLDER_NAME
        self.trust_record = trust_record  # --trust-record: a record owned by another user is used too
        self._checked = False

    def check(self) -> None:
        """Refuse a record that could make git run, or us follow, what someone else planted (`trust.py`)."""
        if self._checked:
            return
        if os.path.lexists(self.path):
            problems = layout_problems(self.path)
            if problems:
                self._refuse(
                    problems,
                    "rlprobe-patch never writes this; someone put it there. Remove it (or the record folder, "
                    "after checking the tree's files) and run the command again",
                )
            if not self.trust_record:
                others = foreign_owners(self.path)
                if others:
                    self._refuse(others, TRUST_HINT)
        self._checked = True

    def _refuse(self, problems: list[str], hint: str, shown: int = 8) -> NoReturn:
        more = [f"... and {len(problems) - 1 - shown} more"] if len(problems) > 1 + shown else []
        raise RefusedError(
            f"refusing the record in {self.path}: {problems[0]}; nothing was run or written",
            details=problems[1 : 1 + shown] + more,
            hint=hint,
        )

    @property
    def ledger_path(self) -> Path:
        return self.path / "ledger.json"

    @property
    def journal_path(self) -> Path:
        return self.path / "journal.json"

    def exists(self) -> bool:
        return self.ledger_path.is_file() or self.journal_path.is_file()

    @contextlib.contextmanager
    def lock(self, timeout: float) -> Iterator[None]:
        self.ensure()
        self.check()
        check_state_folder()  # the write ends by registering the tree: refuse before, not halfway
        with locked(self.path / "lock", timeout, f"{self.root}"):
            for name in ("ledger.json", "journal.json"):
                remove_stale_temp_files(self.path / name)
            yield

    def ensure(self) -> None:
        if self.path.is_dir():
            return
        created = False
        try:
            if not os.access(self.root, os.W_OK):
                raise PermissionError(f"{self.root} is read-only")
            try:
                self.path.mkdir()
            except FileExistsError:
                if self.path.is_dir() and not self.path.is_symlink():
                    return  # another run created it at the same moment; the lock orders the two
                raise
            created = True
            create_new(self.path / ".gitignore", b"*\n")
            create_new(self.path / "README.txt", _README.encode())
        except OSError as exc:
            if created:
                shutil.rmtree(self.path, ignore_errors=True)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise WriteFailedError(
                    f"cannot write {self.root}: {exc.strerror}; nothing was written",
                    hint="free space and run the command again",
                ) from None
            raise RefusedError(
                f"cannot write {self.root} ({exc.strerror or exc}); nothing was written",
                hint="run as a user who can write the tree, or patch a writable copy",
            ) from None

    def read_ledger(self) -> Ledger:
        self.check()
        if not self.ledger_path.is_file():
            return Ledger(root=str(self.root))
        try:
            ledger = load_ledger(json.loads(self.ledger_path.read_text(encoding="utf-8")))
        except ValueError as exc:  # not JSON, or not a ledger of ours (`ledger.DamagedRecord`)
            raise RefusedError(
                f"{self.ledger_path} is unreadable ({exc})",
                hint="it was edited by hand or damaged; restore it, or reinstall the package and delete the folder",
            ) from None
        outside = [name for r in ledger.records for name in (*(f.path for f in r.files), r.diff) if outside_tree(name)]
        if outside:
            raise RefusedError(
                f"{self.ledger_path} names a path outside its tree: {', '.join(outside)}; nothing was written",
                hint="it was edited by hand or damaged; restore it, or reinstall the package and delete the folder",
            )
        return ledger

    def write_ledger(self, ledger: Ledger) -> None:
        atomic_write(self.ledger_path, dump_json(ledger.to_json()))

    def read_journal(self) -> Journal | None:
        return self._load_journal(
            self.journal_path,
            "the interrupted write it records cannot be finished",
            "it was edited by hand or damaged; `rlprobe-patch revert` cannot help: restore the tree's files "
            "from history.git or reinstall the package, then delete the journal",
        )

    def _load_journal(self, path: Path, what: str, hint: str) -> Journal | None:
        self.check()
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            outside = journal_paths_outside(data)
            journal = None if outside else load_journal(data)
        except ValueError as exc:  # not JSON, or not a journal of ours (`ledger.DamagedRecord`)
            raise RefusedError(f"{path} is unreadable ({exc}); {what}", hint=hint) from None
        if journal is None:
            raise RefusedError(
                f"{path} names a path outside its tree: {', '.join(map(str, outside))}; nothing was written",
                hint="it was edited by hand or damaged; delete it after checking the tree's files",
            )
        return journal

    # `undo.json`: a journal that takes the tree back to what it held before the newest apply,
    # written by an apply on a tree that already had records (an upgrade of a patch's revision):
    # the files as they were, the ledger and the branch heads. `revert --back-to` carries it out
    # (the rollback of `cluster apply`); a plain revert takes every record back to the original.
    @property
    def undo_path(self) -> Path:
        return self.path / "undo.json"

    def read_undo(self) -> Journal | None:
        return self._load_journal(
            self.undo_path,
            "the newest apply cannot be undone",
            "it was edited by hand or damaged; `rlprobe-patch revert` still reverts every record",
        )

    def write_undo(self, journal: Journal | None) -> None:
        if journal is None:
            self.undo_path.unlink(missing_ok=True)
        else:
            atomic_write(self.undo_path, dump_json(journal.to_json()))

    def write_journal(self, journal: Journal) -> None:
        atomic_write(self.journal_path, dump_json(journal.to_json()))

    def clear_journal(self) -> None:
        self.journal_path.unlink(missing_ok=True)

    # `checked.json` holds keys "patch id | target | patch fingerprint | sha256 of the file" for
    # files whose syntax-tree check found the patch APPLIED (in memory before apply wrote them,
    # or by verify). verify skips the LibCST pass for a file whose key is there: same bytes,
    # same deciding code, same answer. A cache: losing or damaging it only costs time.
    @property
    def checked_path(self) -> Path:
        return self.path / "checked.json"

    def checked(self) -> set[str]:
        try:
            return set(json.loads(self.checked_path.read_text(encoding="utf-8"))["applied"])
        except (OSError, ValueError, KeyError, TypeError):
            return set()

    def remember_checked(self, keys: set[str]) -> None:
        if not keys or not self.path.is_dir():
            return
        known = self.checked()
        if keys <= known:
            return
        applied = sorted(known | keys)[-CHECKED_LIMIT:]
        try:
            fd, tmp = tempfile.mkstemp(prefix=".checked.", dir=self.path)
            with os.fdopen(fd, "wb") as f:
                f.write(dump_json({"applied": applied}))
            os.replace(tmp, self.checked_path)
        except OSError:
            pass  # a read-only or full state folder: verify just checks again next time

    @staticmethod
    def diff_name(record_id: str) -> str:
        """Where a record's diff lives, relative to the state folder (as the ledger names it)."""
        return f"diffs/{record_id}.diff"

    def write_diff(self, record_id: str, text: str) -> str:
        rel = self.diff_name(record_id)
        (self.path / "diffs").mkdir(exist_ok=True)
        atomic_write(self.path / rel, text.encode("utf-8", errors="surrogateescape"))
        return rel

    def read_diff(self, rel: str) -> str | None:
        path = self.path / rel
        if not path.is_file():
            return None
        return path.read_text(encoding="utf-8", errors="surrogateescape")

    # -- history.git --------------------------------------------------------------------------
    @functools.cached_property
    def history(self) -> History:
        """history.git (`history.History`), read only once the folder is checked."""
        return History(self.path / "history.git", self.check)
