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
from conftest import TESTS, cli_json, snapshot

from rlprobe_patch.base.errors import ExitCode
from runtime import venvs

DRIVER = TESTS / "runtime" / "fsdp_driver.py"
MICRO_BATCHES = 2
IDS = [["req-0", "req-1"], ["req-2", "req-3"]]
# The V1-shaped batch (fsdp_driver.v1_samples): sample 1 is padding with sample 0's fields, left out.
V1_IDS = [["v1-0"], ["v1-2", "v1-3"]]


def run_driver(python: Path, tmp: Path, name: str, *extra: str, **env: str) -> dict:
    out = tmp / f"{name}.json"
    switches = ("DUMP_ON", "DUMP_PHASE", "MSPROBE_ACTOR_CONFIG", "PROMPTS_ONLY")
    clean = {k: v for k, v in os.environ.items() if k not in switches}
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
            *extra,
        ],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["ok"], result
    result["stderr"] = proc.stderr
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
    assert off["msprobe_imported"] is False and "rlprobe-patch: " not in off["stderr"]  # issue 15
    if version == "0.9.1":
        check_switches(python, tmp_path, baseline)

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

    # DUMP_PHASE=all: the training micro-batches, then the log-prob ones. Then (issue 16) the same
    # calls on a V1-shaped batch (verl 0.9's V1 trainer): request ids only in each sample's
    # `extra_fields`, sample 1 a padding sample (uid "pad...") carrying a deep copy of sample 0's
    # fields. Stand-ins (see fsdp_driver.v1_samples): the ids and other fields are made up and the
    # batch is built in the driver rather than fetched from TransferQueue; the engine, the patch
    # and msprobe are real. One line per micro-batch, with exactly the real samples' ids.
    config, dump = msprobe_config(tmp_path, "all")
    run = run_driver(
        python, tmp_path, "patched-all", "--v1-batch", DUMP_ON="1", DUMP_PHASE="all", MSPROBE_ACTOR_CONFIG=str(config)
    )
    assert run["v1_micro_batches"] == {"train": MICRO_BATCHES, "forward_only": MICRO_BATCHES}
    assert run["v1_expected_log_ids"] == V1_IDS
    assert sorted(dumped_steps(dump)) == list(range(4 * MICRO_BATCHES))
    lines = log_lines(dump)
    assert [line["request_ids"] for line in lines] == IDS + IDS + V1_IDS + V1_IDS
    assert [line["num_requests"] for line in lines[2 * MICRO_BATCHES :]] == [len(ids) for ids in V1_IDS + V1_IDS]

    code, out = cli_json("revert", "--python", python)
    assert code == ExitCode.OK, out
    assert snapshot(site / "verl") == pristine


def check_switches(python: Path, tmp_path: Path, baseline: dict) -> None:
    """Issue 15 on the real patched engine: a wrong switch or config stops the first call with an
    error naming the variable, before any micro-batch runs; every bad case in one driver process."""
    good, _ = msprobe_config(tmp_path, "switch-cases")
    not_json = tmp_path / "not-json.json"
    not_json.write_text("{task: statistics")
    refused = tmp_path / "refused.json"
    refused.write_text(json.dumps({"task": "bogus", "dump_path": str(tmp_path / "dump-refused")}))
    cfg = {"MSPROBE_ACTOR_CONFIG": str(good)}
    cases = {
        "DUMP_ON=yess": ({"DUMP_ON": "yess", **cfg}, "DUMP_ON='yess' on rank 0 is not a switch value"),
        "DUMP_PHASE=bogus": ({"DUMP_ON": "1", "DUMP_PHASE": "bogus", **cfg}, "DUMP_PHASE='bogus' on rank 0"),
        "PROMPTS_ONLY=2": ({"PROMPTS_ONLY": "2"}, "PROMPTS_ONLY='2' on rank 0 is not a switch value"),
        "missing config": (
            {"DUMP_ON": "1", "MSPROBE_ACTOR_CONFIG": "/missing.json"},
            "MSPROBE_ACTOR_CONFIG=/missing.json on rank 0: no such file",
        ),
        "default missing": ({"DUMP_ON": "on"}, "/home/config_actor.json (MSPROBE_ACTOR_CONFIG is not set"),
        "not JSON": ({"DUMP_ON": "1", "MSPROBE_ACTOR_CONFIG": str(not_json)}, "not JSON"),
        # last: msprobe's own loader refuses it (its singleton is reset by the hook, not reused)
        "msprobe refuses": ({"DUMP_ON": "1", "MSPROBE_ACTOR_CONFIG": str(refused)}, "msprobe refuses it"),
    }
    spec = tmp_path / "switch-cases.json"
    spec.write_text(json.dumps({name: env for name, (env, _) in cases.items()}))
    result = run_driver(python, tmp_path, "switch-cases", "--switch-cases", str(spec))
    for name, (_, expected) in cases.items():
        outcome = result["switch_cases"][name]
        assert outcome["error"] and outcome["error"].startswith("ValueError: rlprobe-patch: "), (name, outcome)
        assert expected in outcome["error"], (name, outcome)
        assert outcome["loss_calls"] == 0 and not outcome["debugger"], (name, outcome)  # no step ran
    assert str(refused) in result["switch_cases"]["msprobe refuses"]["error"]

    # A spelling that dumped nothing before (DUMP_ON=yes): it dumps, with one line from rank 0.
    config, dump = msprobe_config(tmp_path, "yes")
    on = run_driver(python, tmp_path, "patched-yes", DUMP_ON="yes", MSPROBE_ACTOR_CONFIG=str(config))
    assert on["losses"] == baseline["losses"]
    assert sorted(dumped_steps(dump)) == list(range(MICRO_BATCHES))
    lines = [line for line in on["stderr"].splitlines() if line.startswith("rlprobe-patch: ")]
    assert lines == [
        f"rlprobe-patch: verl.fsdp-engine r2 hooks active (rank 0): DUMP_PHASE=log_prob, config {config}, "
        f"dump path {dump}, PROMPTS_ONLY off"
    ], lines

    # PROMPTS_ONLY without DUMP_ON: the run goes on, with one warning saying what will happen.
    warned = run_driver(python, tmp_path, "prompts-only-alone", PROMPTS_ONLY="TRUE")
    assert warned["losses"] == baseline["losses"] and warned["msprobe_imported"] is False
    warnings = [line for line in warned["stderr"].splitlines() if "DUMP_ON is off" in line]
    assert len(warnings) == 1, warned["stderr"][-2000:]
