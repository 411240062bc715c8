"""The record's ledger (`ledger.json`: what is applied) and journals (`journal.json`, `undo.json`: a write in
flight, the undo of the newest apply), as JSON holds them, and their one loader.

The record lies in trees that others can often write: what is read back is checked before any of it is used
(`load_ledger`, `load_journal`: dacite, strict, each field of its declared type and no key we do not write;
a path that leaves the tree is refused), never passed to a constructor as it is."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import PurePosixPath
from typing import Any

import dacite

# every field of its type, no unknown key; JSON's lists become the tuples the journal declares
_STRICT = dacite.Config(strict=True, cast=[tuple])


class DamagedRecord(ValueError):
    """A ledger or journal that is not what rlprobe-patch writes: edited by hand, damaged, or planted."""


@dataclass
class FileRecord:
    path: str  # relative to the root, POSIX separators
    mode: int
    before: str  # sha256 of the original bytes
    after: str  # sha256 of the patched bytes
    before_blob: str  # git blob ids in history.git
    after_blob: str


@dataclass(frozen=True)
class PatchRef:
    """A patch as a record names it: its id and the revision that was applied."""

    id: str
    revision: int


@dataclass
class Record:
    id: str
    package: str
    version: str
    tool_version: str
    created: str
    backend: str
    mode: str  # "" when only the backend's engine hook was asked for
    patches: list[PatchRef]
    params: dict[str, str]
    files: list[FileRecord]
    diff: str  # path of the diff, relative to the state folder
    commit_before: str = ""
    commit_after: str = ""

    @property
    def patch_ids(self) -> list[str]:
        return [p.id for p in self.patches]

    @property
    def paths(self) -> set[str]:
        return {f.path for f in self.files}


@dataclass
class Ledger:
    root: str
    records: list[Record] = field(default_factory=list)
    schema: int = 1

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def patch_ids(self, package: str) -> list[str]:
        return [p.id for r in self.records if r.package == package for p in r.patches]

    def without(self, ids: set[str]) -> Ledger:
        return Ledger(self.root, [r for r in self.records if r.id not in ids], self.schema)


@dataclass(frozen=True)
class JournalFile:
    """One file a journaled write sets: from the bytes of sha256 `before` to `after` (blob `blob`).

    "" stands for an absent file (a file a patch adds, or a revert removes)."""

    path: str
    mode: int
    before: str
    after: str
    blob: str

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "mode": self.mode, "from": self.before, "to": self.after, "blob": self.blob}


@dataclass(frozen=True)
class Journal:
    """What a write in flight must leave: the files, the ledger and the branch heads after it."""

    op: str  # "apply", "revert" or "undo"
    record: str  # the record id(s) it writes, for messages
    files: tuple[JournalFile, ...]
    ledger: Ledger
    branches: dict[str, str]  # package -> commit of history.git

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "record": self.record,
            "files": [f.to_json() for f in self.files],
            "ledger": self.ledger.to_json(),
            "branches": dict(self.branches),
        }


def outside_tree(name: str) -> bool:
    """Whether a path a record names would leave its tree (absolute, or through `..`)."""
    path = PurePosixPath(name)
    return path.is_absolute() or ".." in path.parts


def _load(kind: type[Any], data: Any) -> Any:
    try:
        return dacite.from_dict(kind, data, config=_STRICT)
    except (dacite.DaciteError, TypeError, AttributeError) as exc:
        raise DamagedRecord(str(exc)) from None


def load_ledger(data: Any) -> Ledger:
    """`ledger.json`'s document as a `Ledger`, each field checked; `DamagedRecord` where it is not what we write."""
    ledger: Ledger = _load(Ledger, data)
    return ledger


def journal_paths_outside(data: Any) -> list[Any]:
    """The paths a journal's document names that are no path inside the tree (not text, or leaving it): read
    before the rest of it, so that such a journal is refused as that."""
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, list) or not all(isinstance(f, dict) for f in files):
        raise DamagedRecord("not a journal: no list of files")
    return [f.get("path") for f in files if not isinstance(f.get("path"), str) or outside_tree(f["path"])]


def load_journal(data: Any) -> Journal:
    """`journal.json`'s (or `undo.json`'s) document as a `Journal`, each field checked (its files' `from` and `to`
    are `before` and `after`); `DamagedRecord` where it is not what we write."""
    journal_paths_outside(data)  # a document with a list of files
    files = [_journal_file(f) for f in data["files"]]
    journal: Journal = _load(Journal, {**data, "files": files})
    return journal


def _journal_file(data: dict[str, Any]) -> dict[str, Any]:
    if "from" not in data or "to" not in data:
        raise DamagedRecord(f"not a journal's file: {str(data)[:80]}")
    named = {k: v for k, v in data.items() if k not in ("from", "to")}
    return {**named, "before": data["from"], "after": data["to"]}
