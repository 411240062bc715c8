"""`verl.prompts-only` in verl 0.9.1's V1 trainer, run for real against TransferQueue (CPU).

Real: verl 0.9.1 installed from its wheel and patched in place by `rlprobe-patch apply --python`;
TransferQueue 0.1.11 (`tq.init` on a local Ray instance: its controller and a SimpleStorage unit
are real Ray actors); the rows, stacked jagged by verl's `list_of_dict_to_tensordict` as
`AgentLoopWorkerTQ` does, and verl's own padding rows (`upsample_batch_to_divisible_size`); the
inserted `_prompts_only_kv_batch` and hook statements, taken from the patched `trainer_base.py`.
Stand-ins: the trainer object around the inserted statements, the token contents of the rows,
and a recorder around the `tq` module that counts calls (see tests/runtime/transferqueue_driver.py).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from conftest import TESTS, cli_json

from rlprobe_patch.base.errors import ExitCode
from runtime import venvs

DRIVER = TESTS / "runtime" / "transferqueue_driver.py"


def test_v1_trim_on_real_transferqueue_rows(tmp_path: Path) -> None:
    with venvs.using_transferqueue() as python:
        code, out = cli_json("apply", "--python", python, "--backend", "fsdp", "--mode", "consistency")
        assert code == ExitCode.OK, out
        assert not any("use_v1" in w for p in out["patches"] for w in p.get("warnings", []))
        code, out = cli_json("verify", "--python", python)
        assert code == ExitCode.OK, [c for t in out["trees"] for c in t["checks"] if not c["ok"]]
        assert any(
            c["check"] == "verl.prompts-only: hooks in place in verl/trainer/ppo/v1/trainer_base.py" and c["ok"]
            for t in out["trees"]
            for c in t["checks"]
        )

        result_file = tmp_path / "v1-trim.json"
        env = {k: v for k, v in os.environ.items() if k != "PROMPTS_ONLY"}
        proc = subprocess.run(
            [str(python), str(DRIVER), "--out", str(result_file)], env=env, capture_output=True, text=True, timeout=400
        )
        result = json.loads(result_file.read_text())
        assert proc.returncode == 0 and result["ok"], result.get("error", proc.stderr[-3000:])

    assert "self._prompts_only_kv_batch(batch)" in "\n".join(result["hook_source"])
    for name, case in result["cases"].items():
        assert case["jagged"] == {"input_ids": True, "position_ids": True}, name  # as AgentLoopWorkerTQ stores them
        assert any(key.startswith("pad") for key in case["keys"]), name  # verl's padding rows are trimmed too
        # PROMPTS_ONLY unset: not one call into TransferQueue, every stored row as it was.
        assert case["unset_calls"] == [] and case["unset_differences"] == [] and case["unset_same_batch"], name
        # Set: one fetch, one put; every row equals the hand-computed trim.
        assert case["set_calls"] == ["kv_batch_get", "kv_batch_put"], name
        assert case["set_differences"] == [] and case["set_same_batch"], name
        for shapes, prompt_len in zip(case["trimmed_shapes"], case["prompt_lens"], strict=True):
            assert shapes["input_ids"] == [prompt_len] and shapes["responses"] == [0]
            assert shapes["position_ids"][-1] == prompt_len and shapes["routed_experts"][0] == prompt_len
    assert result["cases"]["mrope"]["trimmed_shapes"][0]["position_ids"] == [3, 6]
