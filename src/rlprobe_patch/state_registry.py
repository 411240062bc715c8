"""The registry of patched trees, so that `verify` and `revert` work with no arguments.

`$RLPROBE_PATCH_STATE_HOME/registry.json`, else `$XDG_STATE_HOME/rlprobe-patch/registry.json`
(default `~/.local/state/rlprobe-patch/registry.json`): `{"trees": [{"root", "package"}]}`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rlprobe_patch.fsio import atomic_write, locked


def dump_json(data: Any) -> bytes:
    return (json.dumps(data, indent=2) + "\n").encode("utf-8")


def registry_path() -> Path:
    base = os.environ.get("RLPROBE_PATCH_STATE_HOME")
    if base:
        return Path(base) / "registry.json"
    xdg = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(xdg) / "rlprobe-patch" / "registry.json"


def registered_trees() -> list[dict[str, str]]:
    path = registry_path()
    if not path.is_file():
        return []
    try:
        return list(json.loads(path.read_text(encoding="utf-8")).get("trees", []))
    except ValueError:
        return []


def register_tree(root: Path, package: str, present: bool) -> None:
    """Add (present=True) or remove a tree from the registry, under the registry's own lock."""
    path = registry_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with locked(path.with_suffix(".lock"), 30, "the registry"):
        trees = [t for t in registered_trees() if not (t["root"] == str(root) and t["package"] == package)]
        if present:
            trees.append({"root": str(root), "package": package})
        atomic_write(path, dump_json({"trees": trees}))
