"""The registry of patched trees, so that `status`, `verify` and `revert` work with no arguments.

`$RLPROBE_PATCH_STATE_HOME/registry.json`, else `$XDG_STATE_HOME/rlprobe-patch/registry.json`
(default `~/.local/state/rlprobe-patch/registry.json`): `{"trees": [{"root", "package"}]}`.
The folder is created with mode 0700 and used only while it is yours and no one else can write
it. An entry stays when its tree is deleted or moved (the tree is found again if it comes back);
`rlprobe-patch forget PATH` or `status --prune` drop it.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

from rlprobe_patch.base.errors import RefusedError
from rlprobe_patch.base.fsio import atomic_write, dump_json, locked


def registry_path() -> Path:
    base = os.environ.get("RLPROBE_PATCH_STATE_HOME")
    if base:
        return Path(base) / "registry.json"
    xdg = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(xdg) / "rlprobe-patch" / "registry.json"


def _state_folder(create: bool) -> bool:
    """Whether the registry's folder exists (created 0700 if asked); refuses one that is not safe to use."""
    folder = registry_path().parent
    if create:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    elif not folder.is_dir():
        return False
    me = os.geteuid()
    for path in (folder, folder / "registry.json"):
        try:
            st = os.lstat(path) if path != folder else os.stat(path)
        except FileNotFoundError:
            continue
        problem = ""
        if stat.S_ISLNK(st.st_mode) or not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
            problem = "is not a regular file"
        elif st.st_uid != me:
            problem = f"is owned by uid {st.st_uid}, not by you (uid {me})"
        elif st.st_mode & 0o022:
            problem = f"is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
        if problem:
            raise RefusedError(
                f"the registry of patched trees: {path} {problem}; refusing to use it",
                hint="set RLPROBE_PATCH_STATE_HOME (or XDG_STATE_HOME) to a folder of your own (mode 0700), "
                "or fix the owner and mode",
            )
    return True


def check_state_folder() -> None:
    """Refuse an unsafe registry folder before a write that would end by registering a tree."""
    _state_folder(create=False)


def registered_trees() -> list[dict[str, str]]:
    if not _state_folder(create=False):
        return []
    path = registry_path()
    if not path.is_file():
        return []
    try:
        return list(json.loads(path.read_text(encoding="utf-8")).get("trees", []))
    except ValueError:
        return []


def register_tree(root: Path, package: str, present: bool) -> None:
    """Add (present=True) or remove a tree from the registry."""
    entry = {"root": str(root), "package": package}
    _update(lambda trees: [t for t in trees if t != entry] + ([entry] if present else []))


def forget_trees(entries: list[dict[str, str]]) -> list[dict[str, str]]:
    """Drop these entries (root and package); returns those that were registered."""
    unwanted = {(e["root"], e["package"]) for e in entries}
    dropped: list[dict[str, str]] = []

    def change(trees: list[dict[str, str]]) -> list[dict[str, str]]:
        dropped.extend(t for t in trees if (t["root"], t["package"]) in unwanted)
        return [t for t in trees if (t["root"], t["package"]) not in unwanted]

    _update(change)
    return dropped


def _update(change: Callable[[list[dict[str, str]]], list[dict[str, str]]]) -> None:
    """Rewrite the registry with `change(entries)`, under the registry's own lock."""
    _state_folder(create=True)
    path = registry_path()
    with locked(path.with_suffix(".lock"), 30, "the registry"):
        atomic_write(path, dump_json({"trees": change(registered_trees())}), 0o600)
