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
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import re
import shutil
import stat
import tempfile
import time
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from io import BytesIO
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, NoReturn

from gitdb import IStream, LooseObjectDB
from gitdb.exc import BadObject

from rlprobe_patch.base.errors import RefusedError, WriteFailedError
from rlprobe_patch.base.fsio import atomic_write, create_new, dump_json, locked, remove_stale_temp_files, sha256
from rlprobe_patch.base.gitsafe import config_entries, open_repository, run_git
from rlprobe_patch.record.registry import check_state_folder

if TYPE_CHECKING:
    import git

RECORD_FOLDER_NAME = ".rlprobe-patch"
_README = """This folder was written by rlprobe-patch. It records the patches applied to the
package trees beside it, so that `rlprobe-patch verify`, `status` and `revert` work.
Do not edit it by hand; `rlprobe-patch revert` removes the patches and keeps this history.
Inspect it with: git --git-dir history.git log --stat --all ; cat ledger.json
"""
_IDENTITY = "rlprobe-patch <rlprobe-patch@localhost>"  # author and committer of history.git


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

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Record:
        data = dict(data)
        data["files"] = [FileRecord(**f) for f in data["files"]]
        data["patches"] = [PatchRef(str(p["id"]), int(p["revision"])) for p in data["patches"]]
        return cls(**data)

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

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Ledger:
        return cls(root=data["root"], records=[Record.from_json(r) for r in data["records"]], schema=data["schema"])

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

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JournalFile:
        return cls(str(data["path"]), int(data["mode"]), str(data["from"]), str(data["to"]), str(data["blob"]))


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

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Journal:
        return cls(
            op=str(data["op"]),
            record=str(data["record"]),
            files=tuple(JournalFile.from_json(f) for f in data["files"]),
            ledger=Ledger.from_json(data["ledger"]),
            branches={str(k): str(v) for k, v in data["branches"].items()},
        )


CHECKED_LIMIT = 4096


def checked_key(patch_id: str, target: str, fingerprint: str, data: bytes) -> str:
    return f"{patch_id}|{target}|{fingerprint}|{sha256(data)}"


def _outside(name: str) -> bool:
    path = PurePosixPath(name)
    return path.is_absolute() or ".." in path.parts


# What `git init --bare` writes into history.git/config (values: booleans and 0/1), and what else
# git may keep in a bare repository, besides `*.lock` files that a git killed mid-write leaves
# (git never reads them). Anything else in the record is refused (see RecordFolder.check).
_CONFIG_KEYS = {
    "core.repositoryformatversion",
    "core.filemode",
    "core.bare",
    "core.logallrefupdates",
    "core.ignorecase",
    "core.precomposeunicode",
    "core.symlinks",
}
_CONFIG_VALUE = re.compile(r"(?i)true|false|yes|no|on|off|0|1")
_GIT_LAYOUT = {
    "": {"HEAD", "config", "description", "objects", "refs", "packed-refs", "info", "hooks", "logs", "branches"},
    "info": {"exclude", "refs"},
    "objects/info": {"packs", "commit-graph", "commit-graphs"},
}
_TRUST_HINT = (
    "someone else may have planted code or data in it (like git's safe.directory, rlprobe-patch only uses "
    "records owned by you or root): check the folder, then pass --trust-record to use it anyway"
)


class RecordFolder:
    def __init__(self, root: Path, trust_record: bool = False) -> None:
        self.root = root
        self.path = root / RECORD_FOLDER_NAME
        self.trust_record = trust_record  # --trust-record: a record owned by another user is used too
        self._checked = False

    # -- the record is untrusted input ----------------------------------------------------------
    def check(self) -> None:
        """Refuse a record that could make git run, or us follow, what someone else planted.

        No symbolic link or special file anywhere in it; every entry owned by the current user
        or root (unless --trust-record); in history.git only what a bare repository of ours
        holds: no hook but git's `*.sample` files, no `commondir`, no alternates, no
        `info/attributes`, and a config of only the keys in `_CONFIG_KEYS`."""
        if self._checked:
            return
        if os.path.lexists(self.path):
            problems = self._layout_problems()
            if problems:
                self._refuse(
                    problems,
                    "rlprobe-patch never writes this; someone put it there. Remove it (or the record folder, "
                    "after checking the tree's files) and run the command again",
                )
            if not self.trust_record:
                others = self._foreign_owners()
                if others:
                    self._refuse(others, _TRUST_HINT)
        self._checked = True

    def _refuse(self, problems: list[str], hint: str, shown: int = 8) -> NoReturn:
        more = [f"... and {len(problems) - 1 - shown} more"] if len(problems) > 1 + shown else []
        raise RefusedError(
            f"refusing the record in {self.path}: {problems[0]}; nothing was run or written",
            details=problems[1 : 1 + shown] + more,
            hint=hint,
        )

    def _entries(self) -> Iterator[tuple[Path, os.stat_result]]:
        yield self.path, os.lstat(self.path)
        for folder, dirs, files in os.walk(self.path):
            for name in (*dirs, *files):
                path = Path(folder, name)
                try:
                    st = os.lstat(path)
                except FileNotFoundError:  # a git lock file renamed meanwhile
                    continue
                yield path, st

    def _layout_problems(self) -> list[str]:
        st = os.lstat(self.path)
        if stat.S_ISLNK(st.st_mode):
            return [f"{self.path} is a symbolic link (to {os.readlink(self.path)})"]
        if not stat.S_ISDIR(st.st_mode):
            return [f"{self.path} is not a folder"]
        problems = []
        git_dir = self.path / "history.git"
        for path, st in self._entries():
            if stat.S_ISLNK(st.st_mode):
                problems.append(f"{path} is a symbolic link (to {os.readlink(path)})")
            elif not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                problems.append(f"{path} is not a regular file or folder")
            elif git_dir in path.parents:
                rel = path.relative_to(git_dir)
                parent = "" if len(rel.parts) == 1 else rel.parent.as_posix()
                if parent in _GIT_LAYOUT and rel.name not in _GIT_LAYOUT[parent] and rel.suffix != ".lock":
                    problems.append(f"{path}: history.git/{rel.as_posix()} is not part of a record")
                elif parent == "hooks" and not rel.name.endswith(".sample"):
                    problems.append(f"{path}: history.git/{rel.as_posix()} is a git hook")
        if os.path.lexists(git_dir) and not stat.S_ISDIR(os.lstat(git_dir).st_mode):
            problems.append(f"{git_dir} is not a folder")
        elif (git_dir / "config").is_file():
            problems += self._config_problems(git_dir / "config")
        return problems

    @staticmethod
    def _config_problems(path: Path) -> list[str]:
        try:
            entries = config_entries(path)
        except ValueError as exc:
            return [f"{path} does not parse: {exc}"]
        return [
            f"{path} holds {key} = {value}, which rlprobe-patch does not write"
            for key, value in entries
            if key not in _CONFIG_KEYS or not _CONFIG_VALUE.fullmatch(value)
        ]

    def _foreign_owners(self) -> list[str]:
        me = os.geteuid()
        return [
            f"{path} is owned by uid {st.st_uid}, not by you (uid {me}) or root"
            for path, st in self._entries()
            if st.st_uid not in (me, 0)
        ]

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

    # -- ledger -----------------------------------------------------------------------------
    def read_ledger(self) -> Ledger:
        self.check()
        if not self.ledger_path.is_file():
            return Ledger(root=str(self.root))
        try:
            ledger = Ledger.from_json(json.loads(self.ledger_path.read_text(encoding="utf-8")))
        except (ValueError, KeyError, TypeError) as exc:
            raise RefusedError(
                f"{self.ledger_path} is unreadable ({exc})",
                hint="it was edited by hand or damaged; restore it, or reinstall the package and delete the folder",
            ) from None
        outside = [name for r in ledger.records for name in (*(f.path for f in r.files), r.diff) if _outside(name)]
        if outside:
            raise RefusedError(
                f"{self.ledger_path} names a path outside its tree: {', '.join(outside)}; nothing was written",
                hint="it was edited by hand or damaged; restore it, or reinstall the package and delete the folder",
            )
        return ledger

    def write_ledger(self, ledger: Ledger) -> None:
        atomic_write(self.ledger_path, dump_json(ledger.to_json()))

    # -- journal ----------------------------------------------------------------------------
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
            paths = [f["path"] for f in data["files"]]
            outside = [p for p in paths if not isinstance(p, str) or _outside(p)]
            journal = None if outside else Journal.from_json(data)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise RefusedError(f"{path} is unreadable ({exc}); {what}", hint=hint) from None
        if journal is None:
            raise RefusedError(
                f"{path} names a path outside its tree: {', '.join(map(str, outside))}; nothing was written",
                hint="it was edited by hand or damaged; delete it after checking the tree's files",
            )
        return journal

    # -- the undo of the newest apply ---------------------------------------------------------
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

    # -- states remembered per file content ---------------------------------------------------
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

    # -- history.git ------------------------------------------------------------------------
    # Objects are written and read through gitdb's LooseObjectDB (GitPython's object database,
    # pure Python: no git process), as `git hash-object -w` would write them: a record is 20-odd
    # objects, and a git process for each would cost more than the rest of the write. git reads
    # them (log, diff, fsck); refs, and reading objects git may have packed, stay with git.
    @functools.cached_property
    def history(self) -> Path:
        """history.git, created on first use (bare, no template: no sample hooks to copy)."""
        self.check()
        path = self.path / "history.git"
        if not path.is_dir():
            proc = run_git(["init", "--bare", "--template="], git_dir=path)
            if proc.returncode != 0:
                shutil.rmtree(path, ignore_errors=True)  # a half-made repository would fail every later command
                raise _git_failed("init", proc.stderr)
        return path

    @functools.cached_property
    def repo(self) -> git.Repo:
        # GitPython, only to read objects that are not loose (git packed them). One Repo per state
        # folder: its `git cat-file` child must outlive the streams it serves.
        return open_repository(self.history)

    @functools.cached_property
    def _objects(self) -> LooseObjectDB:
        """history.git's loose objects (created on first use, as `history` is)."""
        return LooseObjectDB(str(self.history / "objects"))

    def _write_object(self, kind: bytes, data: bytes) -> str:
        # Not fsynced, as git does not by default (core.fsync leaves loose objects out): the same
        # durability as the `git hash-object -w` this replaces.
        stored = self._objects.store(IStream(kind, len(data), BytesIO(data)))
        return str(stored.hexsha.decode())

    def store_blob(self, data: bytes) -> str:
        return self._write_object(b"blob", data)

    def read_blob(self, hexsha: str) -> bytes:
        if not re.fullmatch(r"[0-9a-f]{40}", hexsha):
            raise ValueError(f"not a blob id: {hexsha!r}")
        self.check()  # no object is read through a planted link
        binsha = bytes.fromhex(hexsha)
        loose = LooseObjectDB(str(self.path / "history.git" / "objects"))  # not `history`: reading creates nothing
        try:
            stream = loose.stream(binsha)
            data: bytes = stream.read()
        except BadObject:  # not a loose object (gitdb says so of an unreadable file too)
            packed: bytes = self.repo.odb.stream(binsha).read()  # packed by git, or absent: it raises
            return packed
        except (zlib.error, ValueError) as exc:  # a bad header or stream, an empty file
            raise OSError(errno.EIO, f"history.git: object {hexsha} is damaged ({exc})") from None
        if stream.type != b"blob" or stream.size != len(data):
            raise OSError(errno.EIO, f"history.git: object {hexsha} is not a whole blob")
        return data

    def commit_files(self, files: dict[str, tuple[str, int]], message: str, parent: str | None) -> str:
        """Commit {path: (blob, mode)} to history.git; returns the commit id."""
        root: dict[str, Any] = {}
        for path, (blob, mode) in files.items():
            *folders, name = path.split("/")
            node = root
            for folder in folders:
                node = node.setdefault(folder, {})
            node[name] = (blob, 0o100755 if mode & 0o111 else 0o100644)

        # Tree and commit objects are serialized here, in git's format: GitPython's serializers
        # (`git.objects.fun.tree_to_stream`, `Commit._serialize`) live in the `git` package, whose
        # import runs `git version` twice, and the commit's wants a Repo; gitdb stores the bytes.
        def write_tree(node: dict[str, Any]) -> str:
            entries = []
            for name, value in node.items():
                if isinstance(value, dict):  # git orders a folder as if its name ended with "/"
                    entries.append((name + "/", b"40000 " + name.encode() + b"\0" + bytes.fromhex(write_tree(value))))
                else:
                    blob, mode = value
                    entries.append((name, b"%o %s\0" % (mode, name.encode()) + bytes.fromhex(blob)))
            return self._write_object(b"tree", b"".join(e for _, e in sorted(entries, key=lambda e: e[0].encode())))

        who = f"{_IDENTITY} {int(time.time())} +0000"
        head = [f"tree {write_tree(root)}", *([f"parent {parent}"] if parent else []), f"author {who}"]
        return self._write_object(b"commit", "\n".join([*head, f"committer {who}", "", message]).encode())

    def set_branch(self, package: str, commit: str) -> None:
        proc = run_git(["update-ref", f"refs/heads/{package}", commit], git_dir=self.history)
        if proc.returncode != 0:
            raise _git_failed("update-ref", proc.stderr)

    def branch_head(self, package: str) -> str | None:
        """The last commit of `package`'s branch in history.git, None before the first record."""
        if not (self.path / "history.git").is_dir():
            return None
        self.check()
        with contextlib.suppress(OSError):  # the loose ref update-ref writes; else ask git (packed refs)
            loose = (self.path / "history.git" / "refs" / "heads" / package).read_text().strip()
            if re.fullmatch(r"[0-9a-f]{40}", loose):
                return loose
        proc = run_git(["rev-parse", "--verify", "--quiet", f"refs/heads/{package}"], git_dir=self.history, text=True)
        head: str = proc.stdout.strip()
        return head if proc.returncode == 0 and head else None

    # -- diffs --------------------------------------------------------------------------------
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


def _git_failed(command: str, stderr: bytes) -> OSError:
    """A failed git command as the OSError it stands for, so that callers treat it as a failed write."""
    said = stderr.decode(errors="replace").strip()
    full = "No space left on device" in said
    code = errno.ENOSPC if full else errno.EIO
    return OSError(
        code, os.strerror(code) if full else f"git {command} failed ({said.splitlines()[-1] if said else 'no message'})"
    )
