"""Unified diffs of planned changes, with the provenance header that `git apply` and unidiff skip."""

from __future__ import annotations

import re
import tempfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from unidiff.errors import UnidiffParseError
from unidiff.patch import PatchSet

from rlprobe_patch.base.errors import RefusedError
from rlprobe_patch.base.gitsafe import run_git


def unified_diff(changes: Mapping[str, tuple[bytes | None, bytes | None]]) -> str:
    """`git diff` of {path: (before, after)}, paths relative to the tree root (a/ b/ prefixes).

    None stands for an absent file: a file a patch adds (or a revert removes). One `git diff
    --no-index` of two folders for all the files; its sections come back in the paths' order."""
    sections: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="rlprobe-diff-") as tmp:
        for path, (before, after) in changes.items():
            for side, data in (("a", before), ("b", after)):
                target = Path(tmp, side, path)
                target.parent.mkdir(parents=True, exist_ok=True)
                if data is not None:
                    target.write_bytes(data)
        proc = run_git(
            ["diff", "--no-index", "--no-prefix", "--no-color", "--no-ext-diff", "--no-textconv", "a", "b"], cwd=tmp
        )
        if proc.returncode not in (0, 1):
            raise RuntimeError(f"git diff failed: {proc.stderr.decode(errors='replace')}")
        text = proc.stdout.decode("utf-8", errors="surrogateescape")
    for section in re.split(r"^(?=diff --git )", text, flags=re.MULTILINE):
        if not section:
            continue
        first, _, rest = section.partition("\n")
        path = _section_path(first, changes)
        # A side that is absent makes git name both sides after the other one.
        sections[path] = f"diff --git a/{path} b/{path}\n{rest}"
    return "".join(sections[path] for path in sorted(sections))


def _section_path(header: str, changes: Mapping[str, object]) -> str:
    """The path of one `diff --git a/P b/P` section (P may hold spaces: matched against the paths given)."""
    for path in changes:
        if header in (
            f"diff --git a/{path} b/{path}",
            f"diff --git b/{path} b/{path}",
            f"diff --git a/{path} a/{path}",
        ):
            return path
    raise RuntimeError(f"git diff named a file it was not given: {header}")


def provenance_header(fields: list[tuple[str, str]]) -> str:
    return "".join(f"# {key}: {value}\n" for key, value in fields) + "#\n"


def diff_paths(diff_text: str) -> list[str]:
    """The paths a recorded diff touches; refuses paths that leave the tree."""
    try:
        patch = PatchSet(diff_text)
    except UnidiffParseError as exc:
        raise RefusedError(f"the recorded diff does not parse: {exc}") from None
    paths = []
    for patched in patch:
        for name in (patched.source_file, patched.target_file):
            rel = name[2:] if name[:2] in ("a/", "b/") else name
            if rel == "/dev/null":
                continue
            pure = PurePosixPath(rel)
            if pure.is_absolute() or ".." in pure.parts:
                raise RefusedError(f"the recorded diff names a path outside its tree: {name}")
        paths.append(patched.path)
    return paths


def diffstat(diff_text: str) -> list[tuple[str, int, int]]:
    return [(f.path, f.added, f.removed) for f in PatchSet(diff_text)]
