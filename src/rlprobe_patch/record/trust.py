"""A record folder is untrusted input: what `RecordFolder.check` refuses before anything in it is read or run.

No symbolic link or special file anywhere in it; every entry owned by the current user or root (unless
--trust-record); in history.git only what a bare repository of ours holds: no hook but git's `*.sample` files, no
`commondir`, no alternates, no `info/attributes`, and a config of only the keys in `CONFIG_KEYS`."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

from rlprobe_patch.base.gitsafe import config_entries

# What `git init --bare` writes into history.git/config (values: booleans and 0/1), and what else
# git may keep in a bare repository, besides `*.lock` files that a git killed mid-write leaves
# (git never reads them). Anything else in the record is refused (`layout_problems`).
CONFIG_KEYS = {
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

TRUST_HINT = (
    "someone else may have planted code or data in it (like git's safe.directory, rlprobe-patch only uses "
    "records owned by you or root): check the folder, then pass --trust-record to use it anyway"
)


def entries(folder: Path) -> Iterator[tuple[Path, os.stat_result]]:
    """`folder` and everything below it, with its `lstat` (a link is not followed)."""
    yield folder, os.lstat(folder)
    for parent, dirs, files in os.walk(folder):
        for name in (*dirs, *files):
            path = Path(parent, name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:  # a git lock file renamed meanwhile
                continue
            yield path, st


def layout_problems(folder: Path) -> list[str]:
    """What in the record folder rlprobe-patch never writes: links, special files, git hooks, foreign git files,
    configuration keys."""
    st = os.lstat(folder)
    if stat.S_ISLNK(st.st_mode):
        return [f"{folder} is a symbolic link (to {os.readlink(folder)})"]
    if not stat.S_ISDIR(st.st_mode):
        return [f"{folder} is not a folder"]
    problems = []
    git_dir = folder / "history.git"
    for path, st in entries(folder):
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
        problems += config_problems(git_dir / "config")
    return problems


def config_problems(path: Path) -> list[str]:
    """The keys and values of history.git's config that rlprobe-patch does not write."""
    try:
        found = config_entries(path)
    except ValueError as exc:
        return [f"{path} does not parse: {exc}"]
    return [
        f"{path} holds {key} = {value}, which rlprobe-patch does not write"
        for key, value in found
        if key not in CONFIG_KEYS or not _CONFIG_VALUE.fullmatch(value)
    ]


def foreign_owners(folder: Path) -> list[str]:
    """The entries owned by someone other than the current user or root."""
    me = os.geteuid()
    return [
        f"{path} is owned by uid {st.st_uid}, not by you (uid {me}) or root"
        for path, st in entries(folder)
        if st.st_uid not in (me, 0)
    ]
