"""`verl.logprob-capture` at runtime in verl 0.9.1 (issue 30), then `rlprobe-patch report` over
what it wrote.

- The V0 trainer: the patched code on verl's own DataProto, batch > 1. Real: verl 0.9.1 from its
  wheel, patched in place by `rlprobe-patch apply --python --only`; torch (CPU); the inserted code
  and hook line read back from the installed file (tests/runtime/logprob_capture_driver.py says
  what is a stand-in).
- The V1 trainer: the patched `PPOTrainer._compute_old_log_prob` against a real TransferQueue
  (0.1.11, on a local Ray instance), on rows stacked as verl's agent loop stacks them and verl's own
  padding rows; verl 0.9.1 patched by `apply --python --mode consistency` in the TransferQueue venv
  (tests/runtime/logprob_capture_tq_driver.py says what is a stand-in).

Both with verl 0.9.1's config as Hydra composes it: the capture's prompt ids must be the prompt tokens
the batch carried (left padding removed) and its provenance the config's dtypes.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
from conftest import TESTS, cli_json

from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.report.capture_format import read_capture
from runtime import venvs

DRIVER = TESTS / "runtime" / "logprob_capture_driver.py"
TQ_DRIVER = TESTS / "runtime" / "logprob_capture_tq_driver.py"


def test_capture_in_the_patched_v0_trainer_then_report(tmp_path: Path) -> None:
    with venvs.using("0.9.1") as python:
        code, out = cli_json("apply", "--python", python, "--backend", "fsdp", "--only", "verl.logprob-capture")
        assert code == ExitCode.OK, out
        proc = subprocess.run(
            [str(python), str(DRIVER), "--out", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=400,
            cwd=tmp_path,
        )
        result = json.loads((tmp_path / "result.json").read_text())
        assert proc.returncode == 0 and result["ok"], result.get("error", proc.stderr[-3000:])
        assert cli_json("revert", "--python", python)[0] == ExitCode.OK

    assert result["v0_hook"].startswith("_RlprobeLogprobCapture()._rlprobe_capture_logprobs(self, batch)")
    assert result["files"] == [f"step-00000{s}.rlprobe-logprobs.npz" for s in (1, 2)]
    captures = tmp_path / "captures"
    step1 = read_capture(captures / "step-000001.rlprobe-logprobs.npz")
    assert step1.samples == 5 and step1.request_ids == [f"vllm-1-{i}" for i in range(5)]
    assert step1.mask.sum(axis=1).tolist() == [8, 1, 0, 4, 3]
    assert step1.prompt_lengths.tolist() == [6, 5, 2, 6, 1]
    assert step1.dataset_index is not None and step1.dataset_index.tolist() == [100, 101, 102, 103, 104]
    assert step1.ref is not None and step1.raw_prompts is not None
    # the rollout's settings from verl's own rollout.yaml (0.9.1: processed log-probs by default), T overridden
    assert step1.sampling == {"temperature": 0.7, "top_p": 1, "top_k": -1, "logprobs_mode": "processed_logprobs"}
    # the prompt each row's forward scored: the batch's prompt tokens, verl's left padding removed
    step2 = read_capture(captures / "step-000002.rlprobe-logprobs.npz")
    for step, read in (("1", step1), ("2", step2)):
        assert [read.prompt(i).tolist() for i in range(read.samples)] == result["v0_prompts"][step], step
        assert read.prompt_ids is not None and read.prompt_ids.shape[1] == max(read.prompt_lengths)
    # what computed each side, as verl 0.9.1's composed config sets it: the launch's dtypes (step 1),
    # verl's defaults (step 2: mixed_precision unset, the FSDP engine computes in bf16; rollout.yaml's bfloat16)
    assert result["config_dtypes"]["1"] == {
        "actor_rollout_ref.actor.strategy": "fsdp",
        "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype": "fp32",
        "actor_rollout_ref.actor.megatron.dtype": None,
        "actor_rollout_ref.rollout.name": "vllm",
        "actor_rollout_ref.rollout.dtype": "float16",
    }
    assert result["config_dtypes"]["2"]["actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype"] is None
    assert result["config_dtypes"]["2"]["actor_rollout_ref.rollout.dtype"] == "bfloat16"
    sides = {"verl_version": "0.9.1", "training_strategy": "fsdp", "rollout_name": "vllm"}
    assert step1.provenance == {**sides, "training_dtype": "float32", "rollout_dtype": "float16"}
    assert step2.provenance == {**sides, "training_dtype": "bfloat16", "rollout_dtype": "bfloat16"}
    assert "holds no rollout_log_probs" in result["no_rollout_error"]
    assert "bypass_mode=True" in result["bypass_error"]

    code, report = cli_json("report", str(captures), "-o", str(tmp_path / "report"))
    # no threshold option: verl's guidance decides (the driver's log-probs differ by design)
    assert code == (ExitCode.VERIFY_FAILED if report["verdict"]["state"] == "fail" else ExitCode.OK), report
    assert (tmp_path / "report" / "report.html").is_file()
    written = (tmp_path / "report" / "report.json").read_text()
    for request in ("vllm-1-0", "vllm-2-2"):
        assert request in written, request
    assert result["v0_step1_metrics"]["training/rollout_probs_diff_max"] > 0  # verl's own number on the same batch


def test_capture_in_the_patched_v1_trainer_on_real_transferqueue_rows(tmp_path: Path) -> None:
    with venvs.using_transferqueue() as python:
        code, out = cli_json("apply", "--python", python, "--backend", "fsdp", "--mode", "consistency")
        assert code == ExitCode.OK, out
        env = {k: v for k, v in os.environ.items() if k not in ("MISMATCH_ON", "MISMATCH_DIR", "PROMPTS_ONLY")}
        proc = subprocess.run(
            [str(python), str(TQ_DRIVER), "--out", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=400,
            cwd=tmp_path,
            env=env,
        )
        result = json.loads((tmp_path / "result.json").read_text())
        assert proc.returncode == 0 and result["ok"], result.get("error", proc.stderr[-3000:])
        assert cli_json("revert", "--python", python)[0] == ExitCode.OK

    assert result["hooks"] == [
        "_RlprobeLogprobCapture()._rlprobe_capture_precondition(self)",
        "_RlprobeLogprobCapture()._rlprobe_capture_kv_logprobs(self, batch, data)",
    ]
    # Off: the trainer's own fetch and put, not one TransferQueue call more; no file.
    assert result["off"]["calls"] == ["trainer:kv_batch_get", "trainer:kv_batch_put"]
    assert result["off"]["error"] is None and result["files_after_off"] == []
    assert result["files"] == ["step-000002.rlprobe-logprobs.npz", "step-000003.rlprobe-logprobs.npz"]
    captures = tmp_path / "captures"
    for step, padding in (("step2", 1), ("step3", 3)):
        run, expected = result[step], result[step]["expected"]
        assert run["error"] is None and run["returned_keys"] == expected["keys"], step
        assert expected["padding"] == padding and sum(k.startswith("pad") for k in expected["keys"]) == padding
        # On: one read per field (extra_fields, index, raw_prompt, input_ids), after the trainer's own two calls.
        assert run["calls"] == ["trainer:kv_batch_get", "trainer:kv_batch_put", *["capture:kv_batch_get"] * 4], step
        assert run["metrics"]["training/rollout_probs_diff_max"] > 0  # verl's own number on the same rows

        read = read_capture(captures / f"step-00000{step[-1]}.rlprobe-logprobs.npz")
        # The real rows, in the batch's (balanced) order; verl's padding rows are no request, though
        # they carry a copy of the first real row's request id.
        assert read.samples == len(expected["request_ids"]) > 1
        assert read.request_ids == expected["request_ids"], step
        assert read.dataset_index is not None and read.dataset_index.tolist() == expected["dataset_index"], step
        assert read.prompt_lengths.tolist() == expected["prompt_lengths"], step
        assert read.ref is None  # the V1 trainer computes ref_log_prob after _compute_old_log_prob
        # verl 0.9.1's composed config: rollout.yaml's sampling defaults
        assert read.sampling == {"temperature": 1.0, "top_p": 1, "top_k": -1, "logprobs_mode": "processed_logprobs"}
        # the prompt each row's forward scored: the first prompt_len of the row's input_ids in TransferQueue
        assert [read.prompt(i).tolist() for i in range(read.samples)] == expected["prompt_ids"], step
        for i, tokens in enumerate(expected["responses"]):
            width = len(tokens)
            assert read.mask[i].sum() == width and read.responses[i, :width].tolist() == tokens, (step, i)
            np.testing.assert_allclose(read.rollout[i, :width], expected["rollout"][i], rtol=1e-6)
            np.testing.assert_allclose(read.training[i, :width], expected["training"][i], rtol=1e-5)
        if expected["raw_prompts"] is None:
            assert read.raw_prompts is None, step
        else:
            assert read.raw_prompts == expected["raw_prompts"], step
    # What computed each side, as verl 0.9.1's composed config sets it: step 2 FSDP with the launch's
    # dtypes (mixed_precision.param_dtype fp32, rollout float16), step 3 Megatron (megatron.dtype float16,
    # the rollout at rollout.yaml's bfloat16).
    dtypes = result["config_dtypes"]
    assert dtypes["fsdp"]["actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype"] == "fp32"
    assert dtypes["fsdp"]["actor_rollout_ref.rollout.dtype"] == "float16"
    assert dtypes["megatron"]["actor_rollout_ref.actor.strategy"] == "megatron"
    assert dtypes["megatron"]["actor_rollout_ref.actor.megatron.dtype"] == "float16"
    assert dtypes["megatron"]["actor_rollout_ref.rollout.dtype"] == "bfloat16"
    sides = {"verl_version": "0.9.1", "rollout_name": "vllm"}
    step2, step3 = (read_capture(captures / f"step-00000{s}.rlprobe-logprobs.npz") for s in (2, 3))
    assert step2.provenance == {
        **sides,
        "training_strategy": "fsdp",
        "training_dtype": "float32",
        "rollout_dtype": "float16",
    }
    assert step3.provenance == {
        **sides,
        "training_strategy": "megatron",
        "training_dtype": "float16",
        "rollout_dtype": "bfloat16",
    }
    # Step 3: one row was sent without verl.request-id (empty there), and the rows have no raw_prompt.
    assert result["step3"]["expected"]["request_ids"].count("") == 1
    assert result["step3"]["expected"]["raw_prompts"] is None
    assert "the capture reads no 'raw_prompt' from TransferQueue" in proc.stderr
    assert proc.stderr.count("the capture reads no 'raw_prompt'") == 1
    # Bypass mode with the capture on: refused by name at the top of the method, before any call.
    assert "bypass_mode=True" in result["bypass"]["error"] and result["bypass"]["calls"] == []

    code, report = cli_json("report", str(captures), "-o", str(tmp_path / "report"))
    # no threshold option: verl's guidance decides (the driver's log-probs differ by design)
    assert code == (ExitCode.VERIFY_FAILED if report["verdict"]["state"] == "fail" else ExitCode.OK), report
    written = (tmp_path / "report" / "report.json").read_text()
    for request in result["step2"]["expected"]["request_ids"]:
        assert request in written, request
