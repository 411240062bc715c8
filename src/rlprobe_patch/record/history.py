"""history.git: a bare git repository in the record folder, per record a commit of the original files and one of
the patched files on the package's branch (reverts too).

Objects are written and read through gitdb's LooseObjectDB (GitPython's object database, pure Python: no git
process), as `git hash-object -w` would write them: a record is 20-odd objects, and a git process for each would
cost more than the rest of the write. git reads them (log, diff, fsck); refs, and reading objects git may have
packed, stay with git (`base.gitsafe`)."""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import re
import shutil
import time
import zlib
from collections.abc import Callable
from io import BytesIO
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gitdb import IStream, LooseObjectDB
from gitdb.exc import BadObject

from rlprobe_patch.base.gitsafe import open_repository, run_git

if TYPE_CHECKING:
    import git

_IDENTITY = "rlprobe-patch <rlprobe-patch@localhost>"  # author and committer of history.git


class History:
    """history.git of one record folder; `check` is the folder's check, run before anything in it is read."""

    def __init__(self, path: Path, check: Callable[[], None]) -> None:
        self.path = path
        self.check = check

    @functools.cached_property
    def git_dir(self) -> Path:
        """history.git, created on first use (bare, no template: no sample hooks to copy)."""
        self.check()
        if not self.path.is_dir():
            proc = run_git(["init", "--bare", "--template="], git_dir=self.path)
            if proc.returncode != 0:
                shutil.rmtree(self.path, ignore_errors=True)  # a half-made repository would fail every later command
                raise _git_failed("init", proc.stderr)
        return self.path

    @functools.cached_property
    def repo(self) -> git.Repo:
        # GitPython, only to read objects that are not loose (git packed them). One Repo per state
        # folder: its `git cat-file` child must outlive the streams it serves.
        return open_repository(self.git_dir)

    @functools.cached_property
    def _objects(self) -> LooseObjectDB:
        """history.git's loose objects (created on first use, as `git_dir` is)."""
        return LooseObjectDB(str(self.git_dir / "objects"))

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
        loose = LooseObjectDB(str(self.path / "objects"))  # not `git_dir`: reading creates nothing
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
        proc = run_git(["update-ref", f"refs/heads/{package}", commit], git_dir=self.git_dir)
        if proc.returncode != 0:
            raise _git_failed("update-ref", proc.stderr)

    def branch_head(self, package: str) -> str | None:
        """The last commit of `package`'s branch in history.git, None before the first record."""
        if not self.path.is_dir():
            return None
        self.check()
        with contextlib.suppress(OSError):  # the loose ref update-ref writes; else ask git (packed refs)
            loose = (self.path / "refs" / "heads" / package).read_text().strip()
            if re.fullmatch(r"[0-9a-f]{40}", loose):
                return loose
        proc = run_git(["rev-parse", "--verify", "--quiet", f"refs/heads/{package}"], git_dir=self.git_dir, text=True)
        head: str = proc.stdout.strip()
        return head if proc.returncode == 0 and head else None


def _git_failed(command: str, stderr: bytes) -> OSError:
    """A failed git command as the OSError it stands for, so that callers treat it as a failed write."""
    said = stderr.decode(errors="replace").strip()
    full = "No space left on device" in said
    code = errno.ENOSPC if full else errno.EIO
    return OSError(
        code, os.strerror(code) if full else f"git {command} failed ({said.splitlines()[-1] if said else 'no message'})"
    )
