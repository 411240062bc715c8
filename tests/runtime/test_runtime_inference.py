"""The inserted SGLang and vLLM-Ascend hooks, run with real msprobe on CPU torch.

Real: the hook code as `rlprobe-patch apply` wrote it into real SGLang / vLLM-Ascend files
from the package index (executed from those files by syntax tree: importing them needs
GPU/NPU stacks), the `dispatch_logger.py` module it added, msprobe writing its dumps, torch.
Stand-in: the runner objects around the hooks (see tests/runtime/inference_driver.py).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import TESTS, cli_json

from rlprobe_patch.base.errors import ExitCode
from runtime import venvs

DRIVER = TESTS / "runtime" / "inference_driver.py"
ENV_KEYS = ("MSPROBE_SGLANG_CONFIG", "MSPROBE_SGLANG_PREFILL_CONFIG", "MSPROBE_SGLANG_DECODE_CONFIG")


@pytest.fixture(scope="module")
def python() -> Path:
    return venvs.ensure_runtime_venv("0.9.1")  # torch 2.13 CPU + mindstudio-probe; its verl is not used


def drive(python: Path, tmp: Path, *args: str, **env: str) -> dict:
    out = tmp / "result.json"
    clean = {k: v for k, v in os.environ.items() if k not in ENV_KEYS}
    proc = subprocess.run(
        [str(python), str(DRIVER), *args, "--out", str(out)],
        env={**clean, **env},
        cwd=tmp,  # ./config.json, the SGLang default, must not exist here
        capture_output=True,
        text=True,
        timeout=300,
    )
    result = json.loads(out.read_text())
    assert proc.returncode == 0 and result["ok"], result.get("error", proc.stderr[-2000:])
    return result


def config(tmp: Path, name: str) -> tuple[Path, Path]:
    dump = tmp / f"dump-{name}"
    path = tmp / f"{name}.json"
    path.write_text(json.dumps({"task": "statistics", "dump_path": str(dump), "level": "mix"}))
    return path, dump


@pytest.mark.parametrize("version", ["0.5.3", "0.4.6.post5"])
def test_sglang_forward_dumps_once_per_pass(python: Path, sglang_tree, tmp_path: Path, version: str) -> None:
    root = sglang_tree(version)
    assert cli_json("apply", "--sglang-root", root)[0] == ExitCode.OK
    patched = str(root / "sglang/srt/model_executor/model_runner.py")

    off = drive(python, tmp_path, "sglang", "--patched-file", patched)
    assert off["debugger"] is False  # no config file: SGLang runs as before

    cfg, dump = config(tmp_path, "sglang")
    on = drive(python, tmp_path, "sglang", "--patched-file", patched, "--forwards", "3", MSPROBE_SGLANG_CONFIG=str(cfg))
    assert on["debugger"] and on["outputs"] == off["outputs"]
    steps = sorted(p.name for p in dump.glob("step*"))
    assert steps == ["step0", "step1", "step2"]
    for step in steps:
        # No process group in this stand-in: msprobe names the folder proc<pid> instead of rank<N>.
        (dump_json,) = (dump / step).glob("*/dump.json")
        assert any(key.startswith("Module.") for key in json.loads(dump_json.read_text())["data"])


def test_sglang_config_errors_name_the_variable(python: Path, sglang_tree, tmp_path: Path) -> None:
    """Issue 15: an explicit config that does not exist, or a wrong switch, stops ModelRunner.__init__
    with an error naming the variable (it dumped nothing, silently, before); none of the variables
    and no default file: no debugger, as before."""
    root = sglang_tree("0.5.8")
    assert cli_json("apply", "--sglang-root", root)[0] == ExitCode.OK
    patched = str(root / "sglang/srt/model_executor/model_runner.py")
    cases = {
        "MSPROBE_SGLANG_CONFIG": ({"MSPROBE_SGLANG_CONFIG": "/missing/sglang.json"}, "null"),
        "MSPROBE_SGLANG_DECODE_CONFIG": ({"MSPROBE_SGLANG_DECODE_CONFIG": "/missing/decode.json"}, "decode"),
        "DUMP_ON": ({"DUMP_ON": "yess"}, "null"),
    }
    for variable, (env, mode) in cases.items():
        args = ("--patched-file", patched, "--disaggregation-mode", mode)
        result = drive_failing(python, tmp_path, "sglang", *args, **env)
        last = result["error"].strip().splitlines()[-1]
        assert last.startswith("ValueError: rlprobe-patch: ") and f"{variable}=" in last, last
        if variable != "DUMP_ON":
            assert f"{env[variable]}: no such file" in last, last
    assert drive(python, tmp_path, "sglang", "--patched-file", patched, "--forwards", "1")["debugger"] is False


def drive_failing(python: Path, tmp: Path, *args: str, **env: str) -> dict:
    out = tmp / "result.json"
    clean = {k: v for k, v in os.environ.items() if k not in ENV_KEYS}
    proc = subprocess.run(
        [str(python), str(DRIVER), *args, "--out", str(out)], env={**clean, **env}, cwd=tmp, timeout=300
    )
    result = json.loads(out.read_text())
    assert proc.returncode == 1 and not result["ok"], result
    return result


def test_sglang_data_parallel_and_pd_roles(python: Path, sglang_tree, tmp_path: Path) -> None:
    root = sglang_tree("0.5.8")
    assert cli_json("apply", "--sglang-root", root)[0] == ExitCode.OK
    patched = str(root / "sglang/srt/model_executor/model_runner.py")
    prefill, prefill_dump = config(tmp_path, "prefill")
    decode, decode_dump = config(tmp_path, "decode")
    env = {"MSPROBE_SGLANG_PREFILL_CONFIG": str(prefill), "MSPROBE_SGLANG_DECODE_CONFIG": str(decode)}
    # data parallel 2: the dump is named after the GPU (rank_id=gpu_id)
    drive(
        python,
        tmp_path,
        "sglang",
        "--patched-file",
        patched,
        "--dp-size",
        "2",
        "--gpu-id",
        "3",
        "--disaggregation-mode",
        "prefill",
        "--forwards",
        "1",
        **env,
    )
    assert (prefill_dump / "step0" / "rank3" / "dump.json").is_file()
    assert not decode_dump.exists()
    drive(
        python,
        tmp_path,
        "sglang",
        "--patched-file",
        patched,
        "--disaggregation-mode",
        "decode",
        "--forwards",
        "1",
        **env,
    )
    assert [p.parent.name[:4] for p in decode_dump.glob("step0/*/dump.json")] == ["proc"]  # dp 1: no rank_id


@pytest.mark.parametrize("version", ["0.13.0", "0.23.0"])
def test_dispatch_logger_logs_each_dumped_step(python: Path, vllm_ascend_tree, tmp_path: Path, version: str) -> None:
    root = vllm_ascend_tree(version)
    assert cli_json("apply", "--vllm-ascend-root", root)[0] == ExitCode.OK
    cfg, dump = config(tmp_path, "rollout")
    result = drive(
        python,
        tmp_path,
        "dispatch",
        "--patched-file",
        str(root / "vllm_ascend/worker/model_runner_v1.py"),
        "--logger-file",
        str(root / "vllm_ascend/worker/dispatch_logger.py"),
        "--config",
        str(cfg),
    )
    assert result["layout"] == ("finalize" if version == "0.23.0" else "inline")
    if version == "0.23.0":
        assert result["step_keywords"][-1] == {"dump": False}  # the dummy run reached the debugger, unlogged
    lines = [json.loads(line) for line in Path(result["log"]).read_text().splitlines()]
    assert Path(result["log"]).parent.parent == dump  # {dump_path}/{pid}/dispatch_log.jsonl
    assert [line["phase"] for line in lines] == ["prefill", "decode", "prefill"]  # no line for the dummy run
    assert [line["step"] for line in lines] == [0, 1, 2]
    assert lines[0]["request_ids"] == ["req-a-0a1b2c3d", "req-b-4e5f6a7b"]
    assert lines[0]["num_scheduled_tokens"] == {"req-a-0a1b2c3d": 5, "req-b-4e5f6a7b": 7}
    assert lines[1]["new_request_ids"] == [] and lines[1]["total_num_scheduled_tokens"] == 2
    assert lines[2]["prefill_request_ids"] == ["req-c-8c9d0e1f"] and lines[2]["num_requests"] == 3
    # one dump per logged step (0.23's dummy run opens one more, which msprobe >26.2 would not dump)
    assert {"step0", "step1", "step2"} <= {p.name for p in dump.glob("step*")}
