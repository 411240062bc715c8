"""The runs a test session makes once and shares between its modules and xdist workers: the consistency demos
(issue 36; test_runtime_consistency_demo.py, and test_first_path_runtime.py, which runs the documented commands on
the same outputs: issue 42) and verl's FSDP engine dumping two micro-batches (test_workflow_check_dump.py's actor
side, test_runtime_sglang_dispatch.py's); test_runtime_megatron_pp.py makes its verl 0.9.1 Megatron engine run
(per VPP) with `once_per_session` too. Under xdist the first worker to ask makes one, the others wait for it and
read it: a module fixture is per worker, and work stealing may split a module's tests between the workers, or run
them on one worker in two spans (the fixture then set up twice)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import TESTS, cli_json

from rlprobe_patch.base.errors import ExitCode
from runtime import venvs

# the demo every vLLM runtime test reads: every plant in one command, one report each (`shared_demo(..., "vllm-all",
# *ALL_PLANTS)`): the README's `demo --consistency` plants the first, `layer`
ALL_PLANTS = ("--plant", "all")
FSDP_DRIVER = TESTS / "runtime" / "fsdp_driver.py"


def once_per_session(factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """The session's folder `shared-NAME`, filled by `build(folder)` once: by the first worker to ask, the others
    waiting for it. A build that fails leaves nothing the next one would take for done."""
    base = factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the session's, shared by its workers
    folder, done = root / f"shared-{name}", root / f"shared-{name}.done"
    with open(root / f"shared-{name}.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            done.touch()
    return folder


def shared_demo(factory: pytest.TempPathFactory, name: str, *args: str) -> tuple[int, dict, Path]:
    """`rlprobe-patch demo --consistency ARGS`, run once per test session. The demo builds its venvs once under the
    test cache, with the wheels the test venvs downloaded. (exit code, its JSON, its workdir.)"""

    def build(folder: Path) -> None:
        with pytest.MonkeyPatch.context() as monkeypatch:
            pip_cache = os.environ.get("PIP_CACHE_DIR") or str(Path("~/.cache/pip").expanduser())
            monkeypatch.setenv("PIP_CACHE_DIR", pip_cache)
            monkeypatch.setenv("XDG_CACHE_HOME", str(venvs.cache_root() / "demo-cache"))
            code, out = cli_json("demo", "--consistency", *args, "--workdir", folder / "demo")
        (folder / "answer.json").write_text(json.dumps([code, out]))

    folder = once_per_session(factory, name, build)
    code, out = json.loads((folder / "answer.json").read_text())
    return code, out, folder / "demo"


def drive_fsdp(python: Path, tmp: Path, name: str, dump_path: Path) -> None:
    """tests/runtime/fsdp_driver.py in `python` (verl patched with verl.fsdp-engine): one log-prob call of two
    micro-batches of one sample (req-0, req-1) on the random model in tmp/model, DUMP_ON=1, msprobe's statistics at
    level mix into `dump_path`."""
    config = tmp / f"config-{name}.json"
    config.write_text(
        json.dumps(
            {
                "task": "statistics",
                "dump_path": str(dump_path),
                "rank": [],
                "step": [],
                "level": "mix",
                "async_dump": False,
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if k not in ("DUMP_PHASE", "PROMPTS_ONLY")}
    env.update(DUMP_ON="1", MSPROBE_ACTOR_CONFIG=str(config))  # DUMP_PHASE default: log_prob (the prefill)
    proc = subprocess.run(
        [str(python), str(FSDP_DRIVER), "--model-dir", str(tmp / "model"), "--micro-batches", "2"]
        + ["--micro-batch-size", "1", "--out", str(tmp / f"{name}.json")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def fsdp_actor_dump(factory: pytest.TempPathFactory) -> Path:
    """verl 0.9.1's real FSDP engine patched with verl.fsdp-engine (`apply --python --backend fsdp2 --only`),
    `drive_fsdp`'s run: the dump folder (`step{N}/rank0/dump.json`, `<pid>/update_actor_log.jsonl`)."""

    def build(folder: Path) -> None:
        with pytest.MonkeyPatch.context() as monkeypatch, venvs.using("0.9.1") as python:
            monkeypatch.setenv("RLPROBE_PATCH_STATE_HOME", str(folder / "state"))  # the registry of this run alone
            code, out = cli_json("apply", "--python", python, "--backend", "fsdp2", "--only", "verl.fsdp-engine")
            assert code == ExitCode.OK, out
            drive_fsdp(python, folder, "actor", folder / "actor")
            assert cli_json("revert", "--python", python)[0] == ExitCode.OK

    return once_per_session(factory, "fsdp-actor-dump", build) / "actor"
