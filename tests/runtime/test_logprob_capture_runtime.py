"""`verl.logprob-capture` at runtime in verl 0.9.1 (issue 30): the patched trainer code on verl's
own DataProto, batch > 1 with padding rows, then `rlprobe-patch report` over what it wrote.

Real: verl 0.9.1 from its wheel, patched in place by `rlprobe-patch apply --python --only`;
torch (CPU); the inserted code and hook lines read back from the installed files
(tests/runtime/logprob_capture_driver.py says what is a stand-in).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import TESTS, cli_json

from rlprobe_patch.errors import ExitCode
from rlprobe_patch.report.capture_format import read_capture
from runtime import venvs

DRIVER = TESTS / "runtime" / "logprob_capture_driver.py"


def test_capture_in_the_patched_trainers_then_report(tmp_path: Path) -> None:
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
    assert result["files"] == [f"step-00000{s}.rlprobe-logprobs.npz" for s in (1, 2, 3)]
    captures = tmp_path / "captures"
    step1 = read_capture(captures / "step-000001.rlprobe-logprobs.npz")
    assert step1.samples == 5 and step1.request_ids == [f"vllm-1-{i}" for i in range(5)]
    assert step1.mask.sum(axis=1).tolist() == [8, 1, 0, 4, 3]
    assert step1.prompt_lengths.tolist() == [6, 5, 2, 6, 1]
    assert step1.dataset_index is not None and step1.dataset_index.tolist() == [100, 101, 102, 103, 104]
    assert step1.ref is not None and step1.raw_prompts is not None
    # V1: 3 real rows + 1 padding row of verl's; the padding row is no request.
    assert result["v1_rows"] == 4 and result["v1_padding"] == 1
    step3 = read_capture(captures / "step-000003.rlprobe-logprobs.npz")
    assert step3.samples == 3 and step3.prompt_lengths.tolist() == [6, 5, 2]
    # The V1 rows' tags carry no request id (the capture makes no TransferQueue call): empty there.
    assert step3.request_ids == ["", "", ""]
    assert "holds no rollout_log_probs" in result["no_rollout_error"]
    assert "bypass_mode=True" in result["bypass_error"]

    code, report = cli_json("report", str(captures), "-o", str(tmp_path / "report"))
    assert code == ExitCode.OK, report
    assert (tmp_path / "report" / "report.html").is_file()
    written = (tmp_path / "report" / "report.json").read_text()
    for request in ("vllm-1-0", "vllm-2-2"):
        assert request in written, request
    assert result["v0_step1_metrics"]["training/rollout_probs_diff_max"] > 0  # verl's own number on the same batch
