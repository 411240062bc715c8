"""The legacy-worker patches (`verl.legacy-fsdp-workers`, `verl.legacy-megatron-workers`).

On verl 0.6.x, and on 0.7.x unless `trainer.use_legacy_worker_impl=disable`, the PPO actor runs
through `fsdp_workers.py` + `actor/dp_actor.py` or `megatron_workers.py` + `actor/megatron_actor.py`,
not through the engine. These tests prove that the inserted code runs, with the real msprobe
on CPU torch:

- FSDP: verl 0.7.1's real, patched `DataParallelPPOActor` (imported from a venv patched
  through `--python`) runs `compute_log_prob` and `update_policy` on real `DataProto`
  batches; only the model is a stand-in (a tiny causal LM, see `runtime/legacy_driver.py`);
- Megatron: the hooks as written into real 0.6.0 and 0.7.1 `megatron_actor.py` files,
  executed inside a stand-in `MegatronPPOActor` through megatron-core 0.16.1's own
  pipeline schedule (PP=1, gloo), since verl's Megatron actor needs GPU-only pieces.

The real-release matrix of both patches: tests/real/test_legacy_workers.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import LEGACY_PATCHES, TESTS, cli_json, snapshot

from rlprobe_patch.base.errors import ExitCode
from runtime import venvs
from runtime.forked_runs import forked_results

DRIVER = TESTS / "runtime" / "legacy_driver.py"
SWITCHES = ("DUMP_ON", "DUMP_PHASE", "MSPROBE_ACTOR_CONFIG", "PROMPTS_ONLY")
MICRO_BATCHES = 3
IDS = [["req-0", "req-1"], ["req-2", "req-3"], ["req-4", "req-5"]]


def msprobe_config(tmp: Path, name: str) -> tuple[Path, Path]:
    dump = tmp / f"dump-{name}"
    config = tmp / f"config-{name}.json"
    config.write_text(
        json.dumps(
            {"task": "statistics", "dump_path": str(dump), "rank": [], "step": [], "level": "mix", "async_dump": False}
        )
    )
    return config, dump


Runs = dict[str, tuple[tuple[str, ...], dict[str, str]]]  # name -> (the driver's arguments, switches set)


def run_drivers(python: Path, tmp: Path, batch: str, runs: Runs) -> dict[str, dict]:
    """The driver's runs, each a process of its own forked from one driver that imported torch (and megatron-core or
    transformers) once (tests/runtime/forked_runs.py): every run's result JSON, by name."""
    clean = {k: v for k, v in os.environ.items() if k not in SWITCHES}
    specs = {
        name: ([*args, "--micro-batches", str(MICRO_BATCHES), "--out", str(tmp / f"{name}.json")], {**clean, **env},
               tmp / f"{name}.json")
        for name, (args, env) in runs.items()
    }  # fmt: skip
    return forked_results(python, DRIVER, specs, tmp / f"runs-{batch}")


def phase_env(config: Path, phase: str) -> dict[str, str]:
    """DUMP_ON with the config, for `phase` (log_prob is the default: DUMP_PHASE left unset for it)."""
    env = {"DUMP_ON": "1", "MSPROBE_ACTOR_CONFIG": str(config)}
    if phase != "log_prob":
        env["DUMP_PHASE"] = phase
    return env


def steps_of(result: dict) -> list[int]:
    return [int(s["step"][4:]) for s in result["dump"]["steps"]]


def backward_keys(result: dict) -> list[int]:
    return [sum(d["backward_keys"] for d in s["dumps"]) for s in result["dump"]["steps"]]


def assert_step_per_micro_batch(events: list[str], calls: int) -> None:
    """Every step: start, one forward (and, for updates, every gradient), then stop and step."""
    starts = [i for i, e in enumerate(events) if e == "debugger.start"]
    assert len(starts) == calls
    for begin in starts:
        end = events.index("debugger.stop", begin)
        assert events[begin:end].count("model.forward") == 1
        assert events[end + 1] == "debugger.step"


def numbers(result: dict) -> dict:
    return {k: result.get(k) for k in ("log_probs", "metrics", "losses", "param_checksum")}


def test_fsdp_legacy_actor_dumps_per_micro_batch(tmp_path: Path) -> None:
    """verl 0.7.1's real DataParallelPPOActor, patched in a venv through `--python`."""
    with venvs.using("0.7.1") as python:
        site = venvs.site_packages(python)
        pristine = snapshot(site / "verl")
        baseline = run_drivers(python, tmp_path, "unpatched", {"unpatched": (("fsdp",), {})})["unpatched"]
        assert baseline["patched"] is False

        code, out = cli_json("apply", "--python", python, "--backend", "fsdp", "--only", "verl.legacy-fsdp-workers")
        assert code == ExitCode.OK, out
        assert out["tree"]["root"] == str(site) and out["files"] == [LEGACY_PATCHES["fsdp"][1]]

        off_config, off_dump = msprobe_config(tmp_path, "off")
        runs: Runs = {"off": (("fsdp",), {"MSPROBE_ACTOR_CONFIG": str(off_config), "DUMP_PHASE": "all"})}
        for phase in ("log_prob", "update_actor", "all"):
            runs[phase] = (("fsdp",), phase_env(msprobe_config(tmp_path, phase)[0], phase))
        prompts_config, _ = msprobe_config(tmp_path, "prompts")
        runs["prompts"] = (
            ("fsdp",),
            {"DUMP_ON": "1", "PROMPTS_ONLY": "1", "MSPROBE_ACTOR_CONFIG": str(prompts_config)},
        )
        results = run_drivers(python, tmp_path, "patched", runs)

        # DUMP_ON unset: the same numbers as the original actor, no file written.
        off = results["off"]
        assert off["patched"] is True and off["real"]["dp_actor"].startswith(str(site))
        assert numbers(off) == numbers(baseline)
        assert not off_dump.exists() and "debugger.start" not in off["events"]

        # DUMP_ON=1: one msprobe step and one log line per micro-batch of the phase asked for.
        for phase in ("log_prob", "update_actor", "all"):
            on = results[phase]
            assert numbers(on) == numbers(baseline), phase
            calls = 2 * MICRO_BATCHES if phase == "all" else MICRO_BATCHES
            assert steps_of(on) == list(range(calls))
            assert_step_per_micro_batch(on["events"], calls)
            lines = on["dump"]["log_lines"]
            assert [line["step"] for line in lines] == list(range(calls))
            assert [line["request_ids"] for line in lines] == IDS * (calls // MICRO_BATCHES)
            assert all(line["source"] == "update_actor" and line["rank"] == 0 for line in lines)
            assert all(line["num_requests"] == 2 for line in lines)
            # Log-prob steps are forward-only; update steps also hold the backward.
            expect = {"log_prob": [False], "update_actor": [True], "all": [False, True]}[phase]
            assert [b > 0 for b in backward_keys(on)] == [x for x in expect for _ in range(MICRO_BATCHES)]
            if phase == "update_actor":
                first_update = on["events"].index("call.update_policy")
                assert "debugger.start" not in on["events"][:first_update]
                # the step closes after the backward: every parameter got its gradient first
                begin = on["events"].index("debugger.start")
                assert on["events"][begin : on["events"].index("debugger.stop", begin)].count("model.grad") == 3

        # PROMPTS_ONLY=1: the log-prob pass runs on the prompt columns only.
        prompts = results["prompts"]
        assert baseline["log_prob_seq_lens"] == [8] * MICRO_BATCHES
        assert prompts["log_prob_seq_lens"] == [5] * MICRO_BATCHES
        assert prompts["log_probs_shape"] == [2 * MICRO_BATCHES, 0]
        assert steps_of(prompts) == list(range(MICRO_BATCHES))

        code, out = cli_json("revert", "--python", python)
        assert code == ExitCode.OK, out
        assert snapshot(site / "verl") == pristine


@pytest.fixture(scope="module")
def megatron_python() -> Path:
    return venvs.ensure_megatron_venv()


@pytest.mark.parametrize("version", ["0.6.0", "0.7.1"])
def test_megatron_legacy_hooks_dump_per_micro_batch(
    real_tree, megatron_python: Path, tmp_path: Path, version: str
) -> None:
    """The hooks written into a real megatron_actor.py, run through megatron-core's schedule."""
    root = real_tree(version)
    code, out = cli_json(
        "apply", "--verl-root", root, "--backend", "megatron", "--only", "verl.legacy-megatron-workers"
    )
    assert code == ExitCode.OK, out
    args = ("megatron", "--patched-file", str(root / LEGACY_PATCHES["megatron"][1]))

    off_config, off_dump = msprobe_config(tmp_path, "off")
    runs: Runs = {"off": (args, {"MSPROBE_ACTOR_CONFIG": str(off_config), "DUMP_PHASE": "all"})}
    for phase in ("log_prob", "update_actor", "all"):
        runs[phase] = (args, phase_env(msprobe_config(tmp_path, phase)[0], phase))
    results = run_drivers(megatron_python, tmp_path, "patched", runs)
    off = results["off"]
    assert not off_dump.exists() and "debugger.start" not in off["events"]

    for phase in ("log_prob", "update_actor", "all"):
        on = results[phase]
        assert numbers(on) == numbers(off), phase
        assert on["open_step"] is False
        calls = 2 * MICRO_BATCHES if phase == "all" else MICRO_BATCHES
        assert steps_of(on) == list(range(calls))
        assert_step_per_micro_batch(on["events"], calls)
        lines = on["dump"]["log_lines"]
        assert [line["step"] for line in lines] == list(range(calls))
        assert all(line["request_ids"] == [] and line["rank"] == 0 for line in lines)  # no ids in legacy Megatron
        expect = {"log_prob": [False], "update_actor": [True], "all": [False, True]}[phase]
        assert [b > 0 for b in backward_keys(on)] == [x for x in expect for _ in range(MICRO_BATCHES)]
        events = on["events"]
        for begin in [i for i, e in enumerate(events) if e == "debugger.start"]:
            window = events[begin : events.index("debugger.stop", begin)]
            if events.index("call.update_policy") < begin:
                # training: closed by the callback queued on autograd, after the whole backward
                assert window.count("loss") == 1 and window.count("model.grad") == 4
            else:
                assert "model.grad" not in window
