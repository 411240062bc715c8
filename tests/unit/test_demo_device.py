"""The vLLM demo's chain on another device (`demo.vllm_consistency.Device`): what bench/gpu_chain.py runs on a GPU
(bfloat16 on both sides, the floor's parts measured) against the CPU demo's plan, and the floor's parts computed
from small runs written here."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from test_demo_plants import PROMPTS  # the same two prompts as the CPU demo's plan tests

from rlprobe_patch.demo.model import DemoModel
from rlprobe_patch.demo.vllm_consistency import (
    BATCH1,
    CLEAN,
    CPU,
    FLOOR,
    PLANTS,
    Device,
    _runs,
    _sessions,
    noise_floors,
    shared_prefix,
    spread,
)

GPU = Device("cuda", "bfloat16", (("VLLM_USE_FLASHINFER_SAMPLER", "0"),), floors=True)


def test_on_the_cpu_the_dtype_plant_moves_the_rollout_to_bfloat16_and_the_trainer_stays_float32(
    tmp_path: Path,
) -> None:
    runs = _runs(tuple(PLANTS), PROMPTS, CPU)
    assert runs["dtype"].session == "bfloat16" and {r.training_dtype for r in runs.values()} == {"float32"}
    sessions = _sessions(runs, DemoModel(tmp_path / "m", True, "", PROMPTS, 64, 8, 40), tmp_path, CPU)
    assert list(sessions) == ["dump", "sample", "bfloat16"]
    assert sessions["bfloat16"]["dtype"] == "bfloat16"
    assert {p["dtype"] for n, p in sessions.items() if n != "bfloat16"} == {"float32"}


def test_on_a_bfloat16_device_the_dtype_plant_samples_with_the_rest_and_the_trainer_moves_to_float32(
    tmp_path: Path,
) -> None:
    runs = _runs(tuple(PLANTS), PROMPTS, GPU)
    assert runs["dtype"].session == "sample" and runs["dtype"].training_dtype == "float32"
    assert {n for n, r in runs.items() if r.training_dtype != "bfloat16"} == {"dtype"}
    sessions = _sessions(runs, DemoModel(tmp_path / "m", True, "", PROMPTS, 64, 8, 40), tmp_path, GPU)
    assert list(sessions) == ["dump", "sample", "batch1"]
    assert {p["dtype"] for p in sessions.values()} == {"bfloat16"}
    assert "dtype" in [r["name"] for r in sessions["sample"]["runs"]]


def test_the_batch1_session_runs_the_floor_runs_requests_and_seeds_one_at_a_time(tmp_path: Path) -> None:
    runs = _runs((), PROMPTS, GPU)
    sessions = _sessions(runs, DemoModel(tmp_path / "m", True, "", PROMPTS, 64, 8, 40), tmp_path, GPU)
    (single,) = sessions["batch1"]["runs"]
    (batched,) = [r for r in sessions["sample"]["runs"] if r["name"] == FLOOR]
    assert sessions["batch1"]["max_num_seqs"] == 1 and sessions["sample"]["max_num_seqs"] == len(PROMPTS)
    assert single["name"] == BATCH1 and single["kind"] == "sample" and not single["rescore"]
    assert single["prompts"] == batched["prompts"] and single["seed"] == batched["seed"]
    # no record, no fingerprints, no dump: its requests share the floor run's ids and must not join the report
    assert not {"record", "fingerprints", "dump_config"} & set(sessions["batch1"])
    assert "batch1" not in _sessions(runs, DemoModel(tmp_path / "m", True, "", PROMPTS, 64, 8, 40), tmp_path, CPU)
    assert runs[CLEAN].training_dtype == "bfloat16"


def test_spread_compares_the_requests_both_hold_up_to_their_shared_tokens() -> None:
    first = {"a": [-1.0, -2.0, -3.0], "b": [-0.5, -0.25], "c": [-9.0]}
    second = {"a": [-1.5, -2.0, -9.0], "b": [-0.25, -0.25, -7.0]}
    got = spread(first, second, {"a": 2})
    # a: two tokens (0.5, 0); b: the two both hold (-0.25, 0); c: only in first
    assert got["tokens"] == 4
    assert got["mean_abs"] == pytest.approx(0.1875) and got["max_abs"] == pytest.approx(0.5)
    assert got["mean"] == pytest.approx(0.0625)
    d = [0.5, 0.0, -0.25, 0.0]
    assert got["k3"] == pytest.approx(sum(math.expm1(x) - x for x in d) / 4)
    assert spread({"a": []}, {"a": [1.0]}) == {"tokens": 0}


def test_shared_prefix_stops_at_the_first_token_sampled_otherwise() -> None:
    got = shared_prefix({"a": [5, 6, 7, 8], "b": [1, 2], "c": [3, 4]}, {"a": [5, 6, 9, 8], "b": [1, 2, 3], "c": []})
    assert got == {"a": 2, "b": 2, "c": 0}


def test_noise_floors_splits_the_floor_run_into_its_parts() -> None:
    floor = {
        "responses": {"a": [5, 6, 7], "b": [1, 2, 3]},
        "logprobs": {"a": [-1.0, -2.0, -3.0], "b": [-0.1, -0.2, -0.3]},
        "prefill_logprobs": {"a": [-1.0, -2.5, -3.0], "b": [-0.1, -0.2, -0.3]},
    }
    trainer = {"a": [-1.25, -2.5, -3.0], "b": [-0.1, -0.2, -0.3]}
    # at batch 1, request b samples another token at position 1: only its first log-prob compares
    batch1 = {"responses": {"a": [5, 6, 7], "b": [1, 9, 3]}, "logprobs": {"a": [-1.0, -2.0, -3.5], "b": [-0.2, -9.0]}}
    parts = noise_floors(floor, trainer, batch1, {"a": [-1.25, -2.5, -3.0], "b": [-0.1, -0.2, -0.4]})
    assert parts["trainer_vs_decode"]["tokens"] == 6 and parts["trainer_vs_decode"]["max_abs"] == pytest.approx(0.5)
    assert parts["trainer_vs_prefill"]["max_abs"] == pytest.approx(0.25)
    assert parts["prefill_vs_decode"]["mean"] == pytest.approx(-0.5 / 6)
    b1 = parts["batched_vs_batch1"]
    assert (b1["tokens"], b1["requests"], b1["parted"], b1["parted_at"]) == (4, 2, 1, [1])
    assert b1["max_abs"] == pytest.approx(0.5) and b1["mean"] == pytest.approx((0.5 + 0.1) / 4)
    assert parts["trainer_batched_vs_single"]["tokens"] == 6
    assert parts["trainer_batched_vs_single"]["max_abs"] == pytest.approx(0.1)
    assert set(noise_floors(floor, trainer)) == {"trainer_vs_decode", "trainer_vs_prefill", "prefill_vs_decode"}
