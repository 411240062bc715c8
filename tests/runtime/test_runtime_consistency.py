"""The consistency patch set's inserted code, run for real inside installed verl releases.

Real: verl (installed in a venv with CPU torch, patched in place by `rlprobe-patch apply
--python ... --mode consistency`), its `DataProto`, `calculate_debug_metrics`,
`compute_rollout_correction_and_add_to_batch` with a real `RolloutCorrectionConfig`, its
rollout client's `generate` (`LLMServerClient` from 0.8.0, `AsyncLLMServerManager` in 0.7.1),
`TokenOutput`. Stand-in: the rollout server answering `generate.remote` (no Ray, no engine),
and, for the trimming, the trainer object around the inserted statements (taken from the
patched `RayPPOTrainer.fit` by syntax tree and executed as written). See
tests/runtime/consistency_driver.py.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
from conftest import TESTS, cli_json, snapshot

from rlprobe_patch.base.errors import ExitCode
from runtime import venvs
from runtime.forked_runs import forked_results

DRIVER = TESTS / "runtime" / "consistency_driver.py"


def drive(python: Path, tmp: Path, runs: list[tuple[str, str, bool]]) -> dict[str, dict]:
    """The driver's runs (name, what, PROMPTS_ONLY), each a process of its own forked from one driver that imported
    torch and what verl imports once (tests/runtime/forked_runs.py): each run's result, by name."""
    tmp.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PROMPTS_ONLY"}
    specs = {
        name: ([what, "--out", str(tmp / f"{name}.json")], {**env, "PROMPTS_ONLY": "1"} if prompts_only else env,
               tmp / f"{name}.json")
        for name, what, prompts_only in runs
    }  # fmt: skip
    return forked_results(python, DRIVER, specs, tmp / f"runs-{runs[0][0]}")


def same_numbers(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all((math.isnan(a[k]) and math.isnan(b[k])) or a[k] == b[k] for k in a)


@pytest.mark.parametrize("version", ["0.9.1", "0.8.0", "0.7.1"])
def test_consistency_set_runs_in_real_verl(version: str, tmp_path: Path) -> None:
    with venvs.using(version) as python:
        check_in_venv(python, version, tmp_path)


def check_in_venv(python: Path, version: str, tmp_path: Path) -> None:
    site = venvs.site_packages(python)
    pristine = snapshot(site / "verl")
    unpatched = drive(python, tmp_path, [("original", "guards", False), ("before", "request-id", False)])
    original, before = unpatched["original"], unpatched["before"]
    assert all("request_id" not in fields for fields in before["extra_fields"])

    code, out = cli_json("apply", "--python", python, "--backend", "fsdp2", "--mode", "consistency")
    assert code == ExitCode.OK, out
    applied = {p["id"] for p in out["patches"] if p["state"] == "applicable"}
    hook = "verl.legacy-fsdp-workers" if version.startswith("0.7") else "verl.fsdp-engine"  # the auto worker path
    assert applied == {
        hook,
        "verl.prompts-only",
        "verl.debug-metrics",
        "verl.rollout-correction",
        "verl.request-id",
        "verl.logprob-capture",
    }
    code, out = cli_json("verify", "--python", python)
    assert code == ExitCode.OK, [c for t in out["trees"] for c in t["checks"] if not c["ok"]]

    patched = drive(
        python,
        tmp_path / "patched",
        [("unset", "guards", False), ("guarded", "guards", True), ("after", "request-id", False)]
        + [("untouched", "trim", False), ("trimmed", "trim", True)],
    )
    # Guards: unset, exactly the original results; PROMPTS_ONLY=1, early returns.
    unset = patched["unset"]
    assert same_numbers(unset["debug_metrics"], original["debug_metrics"])
    assert unset["rollout_correction"] == original["rollout_correction"]
    guarded = patched["guarded"]
    assert guarded["debug_metrics"] == {
        "training/rollout_probs_diff_valid": 0.0,
        "training/rollout_probs_diff_max": 0.0,
        "training/rollout_probs_diff_mean": 0.0,
        "training/rollout_probs_diff_std": 0.0,
        "training/rollout_actor_probs_pearson_corr": 0.0,
    }
    assert guarded["rollout_correction"]["metrics"] == {}
    assert "rollout_is_weights" not in guarded["rollout_correction"]["batch_keys"]
    assert "rollout_is_weights" in original["rollout_correction"]["batch_keys"]

    # Request id: the id the server saw is in extra_fields["request_id"], turn by turn.
    after = patched["after"]
    assert [f["request_id"] for f in after["extra_fields"]] == after["server_saw"]
    assert len(set(after["server_saw"])) == 2
    if version != "0.7.1":  # the fully-async client (0.8.0+) keeps the first of its resumed requests
        fully_async = after["fully_async"]
        assert len(fully_async["server_saw"]) == 2
        assert fully_async["extra_fields"]["request_id"] == fully_async["server_saw"][0]

    # Trimming, on real DataProto batches with 2-D and 3-D position_ids.
    untouched = patched["untouched"]
    assert all(case["untouched"] for case in untouched["cases"].values())
    trimmed = patched["trimmed"]
    for dims, positions in (("2d", [2, 5]), ("3d", [2, 3, 5])):
        case = trimmed["cases"][dims]
        assert case["shapes"] == {
            "attention_mask": [2, 5],
            "input_ids": [2, 5],
            "old_log_probs": [2, 3],
            "position_ids": positions,
            "response_mask": [2, 0],
            "responses": [2, 0],
            "rollout_log_probs": [2, 0],
        }
        assert case["input_ids_equal_prompt"] and case["position_ids_equal_prompt"]

    code, out = cli_json("revert", "--python", python)
    assert code == ExitCode.OK, out
    assert snapshot(site / "verl") == pristine
