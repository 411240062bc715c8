"""The inserted FSDP hooks, run for real inside verl's own FSDP engine (CPU, gloo, FSDP2).

What is real here: verl (an installed release, patched in place by `rlprobe-patch apply
--python`, i.e. found through the training interpreter), torch 2.13 CPU, transformers, a
tiny random Qwen2 built from a config, `FSDPEngineWithLMHead.forward_backward_batch`, and
msprobe (mindstudio-probe 26.2.0) writing its dumps. Nothing is mocked: the driver
(`tests/runtime/fsdp_driver.py`) only builds the engine and calls it, as verl's workers do.
The venvs are built once into the test cache (minutes the first time).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import cli_json, snapshot
from runtime import venvs

from rlprobe_patch.errors import ExitCode

pytestmark = [pytest.mark.runtime, pytest.mark.real]

DRIVER = Path(__file__).parent / "runtime" / "fsdp_driver.py"
MICRO_BATCHES = 2
IDS = [["req-0", "req-1"], ["req-2", "req-3"]]


def run_driver(python: Path, tmp: Path, name: str, **env: str) -> dict:
    out = tmp / f"{name}.json"
    clean = {k: v for k, v in os.environ.items() if k not in ("DUMP_ON", "DUMP_PHASE", "MSPROBE_ACTOR_CONFIG")}
    proc = subprocess.run(
        [
            str(python),
            str(DRIVER),
            "--model-dir",
            str(tmp / "model"),
            "--micro-batches",
            str(MICRO_BATCHES),
            "--out",
            str(out),
        ],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["ok"], result
    return result


def msprobe_config(tmp: Path, name: str) -> tuple[Path, Path]:
    dump = tmp / f"dump-{name}"
    config = tmp / f"config-{name}.json"
    config.write_text(
        json.dumps(
            {"task": "statistics", "dump_path": str(dump), "rank": [], "step": [], "level": "mix", "async_dump": False}
        )
    )
    return config, dump


def dumped_steps(dump: Path) -> dict[int, dict]:
    steps = {}
    for step_dir in sorted(dump.glob("step*")):
        data = json.loads((step_dir / "rank0" / "dump.json").read_text())["data"]
        steps[int(step_dir.name[4:])] = data
    return steps


def log_lines(dump: Path) -> list[dict]:
    logs = list(dump.glob("*/update_actor_log.jsonl"))
    assert len(logs) == 1, logs
    return [json.loads(line) for line in logs[0].read_text().splitlines()]


@pytest.mark.parametrize("version", ["0.9.1", "0.8.0"])
def test_patched_fsdp_engine_dumps_per_micro_batch(version: str, tmp_path: Path) -> None:
    with venvs.using(version) as python:
        check_in_venv(python, version, tmp_path)


def check_in_venv(python: Path, version: str, tmp_path: Path) -> None:
    site = venvs.site_packages(python)
    pristine = snapshot(site / "verl")

    baseline = run_driver(python, tmp_path, "unpatched")

    code, out = cli_json("apply", "--python", python, "--backend", "fsdp2")
    assert code == ExitCode.OK, out
    assert out["tree"]["root"] == str(site) and out["tree"]["version"] == version

    # DUMP_ON unset: the patched engine computes exactly what the original did, and writes nothing.
    config, dump = msprobe_config(tmp_path, "off")
    off = run_driver(python, tmp_path, "patched-off", MSPROBE_ACTOR_CONFIG=str(config))
    assert off["losses"] == baseline["losses"] and off["grad_norms"] == baseline["grad_norms"]
    assert off["log_probs_sha256"] == baseline["log_probs_sha256"]
    assert not dump.exists()

    # DUMP_ON=1, one phase at a time: one msprobe step and one log line per micro-batch.
    for phase, forward_only in (("update_actor", False), ("log_prob", True)):
        config, dump = msprobe_config(tmp_path, phase)
        env = {"DUMP_ON": "1", "MSPROBE_ACTOR_CONFIG": str(config)}
        if phase != "log_prob":
            env["DUMP_PHASE"] = phase  # log_prob is the default
        on = run_driver(python, tmp_path, f"patched-{phase}", **env)
        assert on["losses"] == baseline["losses"]
        steps = dumped_steps(dump)
        assert sorted(steps) == list(range(MICRO_BATCHES))
        for data in steps.values():
            has_backward = any(".backward" in key for key in data)
            assert has_backward is not forward_only, phase
            assert any(key.startswith("Module.") for key in data)  # level mix: modules and APIs
        lines = log_lines(dump)
        assert [line["step"] for line in lines] == list(range(MICRO_BATCHES))
        assert [line["request_ids"] for line in lines] == IDS
        assert all(line["rank"] == 0 and line["source"] == "update_actor" for line in lines)
        assert all(line["num_requests"] == 2 for line in lines)

    # DUMP_PHASE=all: the training micro-batches, then the log-prob ones.
    config, dump = msprobe_config(tmp_path, "all")
    run_driver(python, tmp_path, "patched-all", DUMP_ON="1", DUMP_PHASE="all", MSPROBE_ACTOR_CONFIG=str(config))
    assert sorted(dumped_steps(dump)) == list(range(2 * MICRO_BATCHES))
    assert [line["request_ids"] for line in log_lines(dump)] == IDS + IDS

    code, out = cli_json("revert", "--python", python)
    assert code == ExitCode.OK, out
    assert snapshot(site / "verl") == pristine
