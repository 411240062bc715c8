"""Shared fixtures: scratch copies of our fixture trees and of real verl releases.

Real releases are downloaded once from the package index (`pip download --no-deps`) into
`$RLPROBE_TEST_CACHE` (default `~/.cache/rlprobe-patch-tests`) and unpacked per test.
"""

from __future__ import annotations

import json
import re
import shutil
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from runtime import venvs

from rlprobe_patch import matrix
from rlprobe_patch.catalogue.releases import patches_dir, releases
from rlprobe_patch.cli import main
from rlprobe_patch.fsio import sha256

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures"
# The release rows come from the release data (patches/releases/verl.toml), never from here.
VERL_RELEASES = releases("verl").tested
REFUSED_RELEASES = releases("verl").refused


def verl_wheel(version: str) -> Path:
    """The real verl wheel, downloaded once into the cache (safe across xdist workers)."""
    return matrix.fetch_wheel("verl", version)


SGLANG_MEMBERS = ("sglang/", "sglang-")  # only the Python package and its dist-info are unpacked
VLLM_ASCEND_MEMBERS = ("vllm_ascend/", "vllm_ascend-")


def package_wheel(name: str, version: str) -> Path:
    """A package's wheel from the index (`pip download --no-deps`), cached like verl's."""
    return matrix.fetch_wheel(name, version)


def unpack(wheel: Path, dest: Path, prefixes: tuple[str, ...]) -> Path:
    """Unpack the Python files (and dist-info) of a wheel: no compiled libraries are needed to patch."""
    with zipfile.ZipFile(wheel) as zf:
        for member in zf.namelist():
            if member.startswith(prefixes) and not member.endswith((".so", ".a")):
                zf.extract(member, dest)
    return dest


@pytest.fixture
def sglang_tree(tmp_path: Path):
    return lambda version: unpack(package_wheel("sglang", version), tmp_path / f"sglang-{version}", SGLANG_MEMBERS)


@pytest.fixture
def vllm_ascend_tree(tmp_path: Path):
    return lambda version: unpack(
        package_wheel("vllm-ascend", version), tmp_path / f"vllm-ascend-{version}", VLLM_ASCEND_MEMBERS
    )


@pytest.fixture(autouse=True)
def downloads_only_in_real_tests(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test that fetches a wheel or builds a runtime venv must be marked `real`.

    The fast part of the suite (`-m "not real and not runtime"`, run on Python 3.10 and 3.13 in CI)
    must never reach the package index: an unmarked test that tries fails here, loudly.
    """
    if request.node.get_closest_marker("real") is not None:
        return

    def refuse(*args: object, **kwargs: object) -> None:
        pytest.fail(f"{request.node.nodeid} fetches a wheel or builds a venv: mark it `real`", pytrace=False)

    monkeypatch.setattr(matrix, "fetch_wheel", refuse)
    for name in ("ensure_verl_wheel", "ensure_runtime_venv", "ensure_megatron_venv"):
        monkeypatch.setattr(venvs, name, refuse)


@pytest.fixture(autouse=True)
def state_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own registry of patched trees."""
    home = tmp_path_factory.mktemp("state-home")
    monkeypatch.setenv("RLPROBE_PATCH_STATE_HOME", str(home))
    return home


@pytest.fixture
def fixture_tree(tmp_path: Path):
    def make(family: str) -> Path:
        dest = tmp_path / f"fixture-{family}"
        shutil.copytree(FIXTURES / f"verl-{family}", dest)
        return dest

    return make


@pytest.fixture
def real_tree(tmp_path: Path):
    def make(version: str) -> Path:
        dest = tmp_path / f"verl-{version}"
        with zipfile.ZipFile(verl_wheel(version)) as zf:
            zf.extractall(dest)
        return dest

    return make


def snapshot(root: Path) -> dict[str, tuple[str, int]]:
    """Content hash and mode of every file, outside our state folder."""
    return {
        p.relative_to(root).as_posix(): (sha256(p.read_bytes()), p.stat().st_mode & 0o7777)
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".rlprobe-patch" not in p.relative_to(root).parts
    }


# The statement a test catalogue adds at the end of a worker hook's `__init__` (its new payload).
END_OF_INIT = "    self._update_actor_logger_fp = None\n"


def changed_catalogue(dest: Path, patch: str, revision: int) -> Path:
    """A copy of the catalogue at `dest` where `patch`'s payload adds one statement at the end of
    `__init__` and its revision is `revision`: another revision of the patch, for upgrade tests."""
    shutil.copytree(patches_dir(), dest, ignore=shutil.ignore_patterns("__pycache__"))
    payload = dest / patch / "payload.py"
    text = payload.read_text()
    assert text.count(END_OF_INIT) == 1
    payload.write_text(text.replace(END_OF_INIT, END_OF_INIT + f"    self._dump_steps = 0  # revision {revision}\n"))
    meta = dest / patch / "patch.toml"
    meta.write_text(re.sub(r"(?m)^revision = \d+$", f"revision = {revision}", meta.read_text(), count=1))
    return dest


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def cli_json(*args: str) -> tuple[int, dict]:
    result = cli(*args, "--json")
    return result.exit_code, json.loads(result.stdout)
