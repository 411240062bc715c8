"""`rlprobe-patch demo`: the whole cycle on a real verl release, in a scratch folder.

Fetches the release's wheel from the package index (falls back to the bundled fixture tree
when the index cannot be reached), unpacks it, applies the FSDP and Megatron engine patches,
verifies them, prints the diff stat, reverts, and proves that every file is byte-identical
(content and mode) to what was unpacked.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlprobe_patch.base.diffs import diffstat
from rlprobe_patch.base.fsio import sha256
from rlprobe_patch.catalogue.trees import find_verl_tree
from rlprobe_patch.core.apply import apply
from rlprobe_patch.core.revert import revert
from rlprobe_patch.core.verify import verify
from rlprobe_patch.record.folder import RECORD_FOLDER_NAME


def fixtures_dir() -> Path:
    package = Path(__file__).resolve().parents[1]  # rlprobe_patch/
    for candidate in (package / "fixtures", package.parents[1] / "fixtures"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("the bundled fixtures are missing from this installation")


def wheel_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rlprobe-patch" / "wheels"


def fetch_verl_wheel(version: str, progress: Callable[[str], None]) -> Path:
    """The verl wheel from the package index, cached; raises OSError when it cannot be had."""
    cache = wheel_cache()
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob(f"verl-{version}-*.whl"))
    if found:
        return found[0]
    progress(f"downloading verl {version} from the package index")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "-q",
            "-d",
            str(cache),
            f"verl=={version}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    found = sorted(cache.glob(f"verl-{version}-*.whl"))
    if proc.returncode != 0 or not found:
        raise OSError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "pip download failed")
    return found[0]


def snapshot(root: Path) -> dict[str, tuple[str, int]]:
    files = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if rel.parts[0] == RECORD_FOLDER_NAME or not path.is_file():
            continue
        files[rel.as_posix()] = (sha256(path.read_bytes()), path.stat().st_mode & 0o7777)
    return files


def run_demo(
    version: str,
    *,
    offline: bool,
    workdir: Path | None,
    say: Callable[..., None],
    progress: Callable[[str], None],
) -> dict[str, Any]:
    work = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="rlprobe-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    tree_root = work / "tree"
    if tree_root.exists():
        shutil.rmtree(tree_root)
    source = ""
    if not offline:
        try:
            wheel = fetch_verl_wheel(version, progress)
            with zipfile.ZipFile(wheel) as zf:
                zf.extractall(tree_root)
            source = f"verl {version} wheel from the package index ({wheel.name})"
        except (OSError, subprocess.TimeoutExpired, zipfile.BadZipFile) as exc:
            say(f"could not fetch verl {version} ({exc}); using the bundled fixture instead", fg="yellow")
    if not source:
        shutil.copytree(fixtures_dir() / "verl-0.9", tree_root)
        source = "bundled fixture fixtures/verl-0.9 (mimics verl 0.9.x structure; not verl itself)"
    say(f"tree: {tree_root}  ({source})", bold=True)

    # Keep the demo out of the user's registry of patched trees.
    saved = os.environ.get("RLPROBE_PATCH_STATE_HOME")
    os.environ["RLPROBE_PATCH_STATE_HOME"] = str(work / "state")
    try:
        before = snapshot(tree_root)
        tree = find_verl_tree(tree_root)
        say(f"found verl {tree.version} (version from {tree.version_source})")
        applied = []
        for backend in ("fsdp", "megatron"):
            result = apply(tree, backend, progress=progress)
            assert result.record is not None
            applied.append(result.record.id)
            say(f"apply --backend {backend}: {', '.join(p.id for p in result.record.patches)}", fg="green")
            for path, added, removed in diffstat(result.diff):
                say(f"    {path} | +{added} -{removed}")
            for plan in result.plan.patches:
                for notice in plan.notices:
                    say(f"    notice: {notice}", fg="yellow")
        again = apply(tree, "fsdp", progress=progress)
        say(f"apply again: {'already applied, nothing written' if again.already_applied else 'CHANGED FILES'}")
        results = [verify(tree)]
        verified = all(r.ok for r in results)
        for r in results:
            for check in r.checks:
                say(f"    {'PASS' if check.ok else 'FAIL'}  {check.check}", fg=None if check.ok else "red")
        say(f"verify: {'all checks pass' if verified else 'FAILED'}", fg="green" if verified else "red")
        reverted = revert(tree.root, tree, progress=progress)
        after = snapshot(tree_root)
        identical = before == after
        say(f"revert: {len(reverted.files)} file(s) restored", fg="green")
        say(
            f"byte-identical to the unpacked release: {'yes' if identical else 'NO'} ({len(after)} files compared)",
            fg="green" if identical else "red",
            bold=True,
        )
    finally:
        if saved is None:
            os.environ.pop("RLPROBE_PATCH_STATE_HOME", None)
        else:
            os.environ["RLPROBE_PATCH_STATE_HOME"] = saved
    return {
        "workdir": str(work),
        "source": source,
        "version": str(tree.version),
        "records": applied,
        "already_applied_on_second_run": again.already_applied,
        "verified": verified,
        "identical": identical,
        "files_compared": len(after),
    }
