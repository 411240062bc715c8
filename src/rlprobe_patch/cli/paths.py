"""Path options that say what they must name, checked before a command runs (exit 3, never a traceback).

A click `Path` refuses with a usage error (exit 2) and only for what exists; our commands refuse
a path that cannot serve (a folder that does not exist, a directory where a file is wanted, a file
where a directory is wanted) as any other refusal, with exit 3 and the path named. `command`
(`cli/output.py`) runs `check_path_options` on every `CheckedPath` parameter of the command;
what only the write itself can tell (a folder that is not writable) is turned into the same
refusal by `os_error`.
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any, Literal

import click

from rlprobe_patch.base.errors import PatchError, RefusedError, WriteFailedError

Want = Literal["file", "dir", "file-or-dir", "new-file", "new-dir"]


class CheckedPath(click.Path):
    """A `pathlib.Path` parameter and what it must name: an existing `file` / `dir` / `file-or-dir`, or
    a `new-file` / `new-dir` the command writes (its folder must exist; a new directory's parents are made)."""

    def __init__(self, want: Want) -> None:
        super().__init__(path_type=Path)
        self.want = want


def _nearest_existing(path: Path) -> Path:
    for parent in path.absolute().parents:
        if parent.exists():
            return parent
    return Path("/")


def check_path(path: Path, want: Want, option: str) -> None:
    """Refuse `path` for `option` when it cannot be what `want` says."""

    if want in ("file", "dir", "file-or-dir"):
        if not path.exists():
            missing = next((p for p in reversed(path.absolute().parents) if not p.exists()), None)
            where = f" (the folder {missing} does not exist)" if missing is not None else ""
            what = {"file": "file", "dir": "directory", "file-or-dir": "file or directory"}[want]
            raise RefusedError(f"{option} {path}: no such {what}{where}")
        if want == "file" and path.is_dir():
            raise RefusedError(f"{option} {path}: is a directory; a file is wanted")
        if want == "dir" and not path.is_dir():
            raise RefusedError(f"{option} {path}: is a file; a directory is wanted")
        return
    if path.exists():
        if want == "new-file" and path.is_dir():
            raise RefusedError(f"{option} {path}: is a directory; the file to write is wanted")
        if want == "new-dir" and not path.is_dir():
            raise RefusedError(f"{option} {path}: is a file; a directory to write into is wanted")
        return
    if want == "new-file" and not path.parent.exists():
        raise RefusedError(
            f"{option} {path}: the folder {path.parent} does not exist",
            hint=f"create it first (mkdir -p {path.parent}) or write elsewhere",
        )
    ancestor = _nearest_existing(path)
    if not ancestor.is_dir():
        raise RefusedError(f"{option} {path}: {ancestor} is a file; a directory is wanted there")


def check_path_options(kwargs: dict[str, Any]) -> None:
    """Check every `CheckedPath` parameter of the running click command among `kwargs`."""

    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return
    for param in ctx.command.params:
        if not isinstance(param.type, CheckedPath) or param.name is None:
            continue
        value = kwargs.get(param.name)
        values = value if isinstance(value, tuple) else (value,)
        label = max(param.opts, key=len) if isinstance(param, click.Option) else param.human_readable_name
        for item in values:
            if item is not None:
                check_path(Path(item), param.type.want, label)


def os_error(exc: OSError) -> PatchError | None:
    """A refusal for an OSError about a path the command was given (None when it names no file): exit 3,
    or exit 7 when the disk itself failed (full, I/O error)."""

    if exc.filename is None:
        return None
    what = f"{exc.filename}: {exc.strerror or exc}"
    if exc.errno in (errno.ENOSPC, errno.EIO, errno.EDQUOT):
        return WriteFailedError(what)
    hint = {
        errno.ENOENT: "a folder on the way does not exist",
        errno.EISDIR: "a directory was given where a file is wanted",
        errno.ENOTDIR: "a file was given where a directory is wanted",
        errno.EACCES: "this user may not write or read there",
        errno.EPERM: "this user may not write or read there",
        errno.EROFS: "the file system is read-only",
    }.get(exc.errno or 0, "")
    return RefusedError(what, hint=hint)
