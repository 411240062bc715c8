"""The consistency demos a test session runs once and shares (issue 36): under xdist the first worker to ask runs
the demo, the others wait for it and read its answer. Used by test_runtime_consistency_demo.py and by
test_first_path_runtime.py, which runs the documented commands on the same outputs (issue 42)."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import pytest
from conftest import cli_json

from runtime import venvs

# the demo every vLLM runtime test reads: every plant in one command, one report each (`shared_demo(..., "vllm-all",
# *ALL_PLANTS)`): the README's `demo --consistency` plants the first, `layer`
ALL_PLANTS = ("--plant", "all")


def shared_demo(factory: pytest.TempPathFactory, name: str, *args: str) -> tuple[int, dict, Path]:
    """`rlprobe-patch demo --consistency ARGS`, run once per test session: under xdist the first worker to ask
    runs it and the others wait for it and read its answer (a module fixture is per worker: the tests of one
    module on two workers would run the same demo twice). The demo builds its venvs once under the test cache,
    with the wheels the test venvs downloaded. (exit code, its JSON, its workdir.)"""
    base = factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the session's, shared by its workers
    work, answer = root / f"shared-{name}" / "demo", root / f"shared-{name}.json"
    with open(root / f"shared-{name}.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if answer.is_file():
            code, out = json.loads(answer.read_text())
            return code, out, work
        with pytest.MonkeyPatch.context() as monkeypatch:
            pip_cache = os.environ.get("PIP_CACHE_DIR") or str(Path("~/.cache/pip").expanduser())
            monkeypatch.setenv("PIP_CACHE_DIR", pip_cache)
            monkeypatch.setenv("XDG_CACHE_HOME", str(venvs.cache_root() / "demo-cache"))
            code, out = cli_json("demo", "--consistency", *args, "--workdir", work)
        answer.write_text(json.dumps([code, out]))
    return code, out, work
