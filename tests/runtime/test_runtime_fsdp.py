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
from pathlib import Path

import pytest
from conftest import TESTS, cli_json, snapshot

from rlprobe_patch.base.errors import ExitCode
from runtime import venvs
from runtime.forked_runs import forked_results

DRIVER = TESTS / "runtime" / "fsdp_driver.py"
MICRO_BATCHES = 2
IDS = [["req-0", "req-1"], ["req-2", "req-3"]]
# The V1-shaped batch (fsdp_driver.v1_samples): sample 1 is padding with sample 0's fields, left out.
V1_IDS = [["v1-0"], ["v1-2", "v1-3"]]


SWITCHES = ("DUMP_ON", "DUMP_PHASE", "MSPROBE_ACTOR_CONFIG", "PROMPTS_ONLY")
Runs = dict[str, tuple[tuple[str, ...], dict[str, str]]]  # name -> (the driver's extra arguments, switches set)


def run_drivers(python: Path, tmp: Path, batch: str, runs: Runs) -> dict[str, dict]:
    """The driver's runs, each a process of its own forked from one driver that imported torch and transformers
    once (tests/runtime/forked_runs.py); every run's result JSON with its standard error (`stderr`), by name."""
    clean = {k: v for k, v in os.environ.items() if k not in SWITCHES}
    common = ["--model-dir", str(tmp / "model"), "--micro-batches", str(MICRO_BATCHES)]
    specs = {
        name: ([*common, "--out", str(tmp / f"{name}.json"), *extra], {**clean, **env}, tmp / f"{name}.json")
        for name, (extra, env) in runs.items()
    }
    return forked_results(python, DRIVER, specs, tmp / f"runs-{batch}")


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

    baseline = run_drivers(python, tmp_path, "unpatched", {"unpatched": ((), {})})["unpatched"]

    code, out = cli_json("apply", "--python", python, "--backend", "fsdp2")
    assert code == ExitCode.OK, out
    assert out["tree"]["root"] == str(site) and out["tree"]["version"] == version

    # every run of the patched engine, then what each shows
    off_config, off_dump = msprobe_config(tmp_path, "off")
    runs: Runs = {"patched-off": ((), {"MSPROBE_ACTOR_CONFIG": str(off_config)})}
    phases = {}
    for phase in ("update_actor", "log_prob"):
        config, phases[phase] = msprobe_config(tmp_path, phase)
        env = {"DUMP_ON": "1", "MSPROBE_ACTOR_CONFIG": str(config)}
        if phase != "log_prob":
            env["DUMP_PHASE"] = phase  # log_prob is the default
        runs[f"patched-{phase}"] = ((), env)
    all_config, all_dump = msprobe_config(tmp_path, "all")
    all_env = {"DUMP_ON": "1", "DUMP_PHASE": "all", "MSPROBE_ACTOR_CONFIG": str(all_config)}
    runs["patched-all"] = (("--v1-batch",), all_env)
    if version == "0.9.1":
        runs |= switch_runs(tmp_path)
    results = run_drivers(python, tmp_path, "patched", runs)

    # DUMP_ON unset: the patched engine computes exactly what the original did, and writes nothing.
    off = results["patched-off"]
    assert off["losses"] == baseline["losses"] and off["grad_norms"] == baseline["grad_norms"]
    assert off["log_probs_sha256"] == baseline["log_probs_sha256"]
    assert not off_dump.exists()
    assert off["msprobe_imported"] is False and "rlprobe-patch: " not in off["stderr"]  # issue 15
    if version == "0.9.1":
        check_switches(results, tmp_path, baseline)

    # DUMP_ON=1, one phase at a time: one msprobe step and one log line per micro-batch.
    for phase, forward_only in (("update_actor", False), ("log_prob", True)):
        on, dump = results[f"patched-{phase}"], phases[phase]
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
    run = results["patched-all"]
    assert run["v1_micro_batches"] == {"train": MICRO_BATCHES, "forward_only": MICRO_BATCHES}
    assert run["v1_expected_log_ids"] == V1_IDS
    assert sorted(dumped_steps(all_dump)) == list(range(4 * MICRO_BATCHES))
    lines = log_lines(all_dump)
    assert [line["request_ids"] for line in lines] == IDS + IDS + V1_IDS + V1_IDS
    assert [line["num_requests"] for line in lines[2 * MICRO_BATCHES :]] == [len(ids) for ids in V1_IDS + V1_IDS]

    code, out = cli_json("revert", "--python", python)
    assert code == ExitCode.OK, out
    assert snapshot(site / "verl") == pristine


def switch_cases(tmp_path: Path) -> dict[str, tuple[dict[str, str], str]]:
    """Issue 15's bad switches and configs: name -> (the environment, what the error says)."""
    good, _ = msprobe_config(tmp_path, "switch-cases")
    not_json = tmp_path / "not-json.json"
    not_json.write_text("{task: statistics")
    refused = tmp_path / "refused.json"
    refused.write_text(json.dumps({"task": "bogus", "dump_path": str(tmp_path / "dump-refused")}))
    cfg = {"MSPROBE_ACTOR_CONFIG": str(good)}
    return {
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


def switch_runs(tmp_path: Path) -> Runs:
    """The runs `check_switches` reads: every bad case in one run, DUMP_ON=yes, PROMPTS_ONLY alone."""
    spec = tmp_path / "switch-cases.json"
    spec.write_text(json.dumps({name: env for name, (env, _) in switch_cases(tmp_path).items()}))
    config, _ = msprobe_config(tmp_path, "yes")
    return {
        "switch-cases": (("--switch-cases", str(spec)), {}),
        "patched-yes": ((), {"DUMP_ON": "yes", "MSPROBE_ACTOR_CONFIG": str(config)}),
        "prompts-only-alone": ((), {"PROMPTS_ONLY": "TRUE"}),
    }


def check_switches(results: dict[str, dict], tmp_path: Path, baseline: dict) -> None:
    """Issue 15 on the real patched engine: a wrong switch or config stops the first call with an
    error naming the variable, before any micro-batch runs; every bad case in one driver process."""
    cases = switch_cases(tmp_path)
    result = results["switch-cases"]
    for name, (_, expected) in cases.items():
        outcome = result["switch_cases"][name]
        assert outcome["error"] and outcome["error"].startswith("ValueError: rlprobe-patch: "), (name, outcome)
        assert expected in outcome["error"], (name, outcome)
        assert outcome["loss_calls"] == 0 and not outcome["debugger"], (name, outcome)  # no step ran
    assert str(tmp_path / "refused.json") in result["switch_cases"]["msprobe refuses"]["error"]

    # A spelling that dumped nothing before (DUMP_ON=yes): it dumps, with one line from rank 0.
    config, dump = tmp_path / "config-yes.json", tmp_path / "dump-yes"
    on = results["patched-yes"]
    assert on["losses"] == baseline["losses"]
    assert sorted(dumped_steps(dump)) == list(range(MICRO_BATCHES))
    lines = [line for line in on["stderr"].splitlines() if line.startswith("rlprobe-patch: ")]
    assert lines == [
        f"rlprobe-patch: verl.fsdp-engine r2 hooks active (rank 0): DUMP_PHASE=log_prob, config {config}, "
        f"dump path {dump}, PROMPTS_ONLY off"
    ], lines

    # PROMPTS_ONLY without DUMP_ON: the run goes on, with one warning saying what will happen.
    warned = results["prompts-only-alone"]
    assert warned["losses"] == baseline["losses"] and warned["msprobe_imported"] is False
    warnings = [line for line in warned["stderr"].splitlines() if "DUMP_ON is off" in line]
    assert len(warnings) == 1, warned["stderr"][-2000:]
