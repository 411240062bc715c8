"""`rlprobe-patch config`: the skill's rules per mode and side (msprobe's own loading of the file:
tests/runtime/test_workflow_config_runtime.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import cli, cli_json

from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.workflow.config import SGLANG_STEP_WARNING, build_config, rule_problems


@pytest.mark.parametrize(
    ("mode", "side", "dump", "step"),
    [
        ("training", "training", None, []),
        ("inference", "generate", "/d/generate", [0]),
        ("consistency", "generate", "/d/generate", []),  # one msprobe step per forward pass (issue 35, item 2)
        ("consistency", "actor", "/d/actor", []),
    ],
)
def test_rules(mode: str, side: str, dump: str | None, step: list[int]) -> None:
    data = build_config(mode, side, dump)
    assert data["level"] == "mix" and data["step"] == step and data["task"] == "statistics"
    assert data.get("dump_path") == dump
    assert data["statistics"]["data_mode"] == ["all"] and data["statistics"]["summary_mode"] == "statistics"


def test_consistency_generate_dumps_every_forward_pass(tmp_path: Path) -> None:
    """SGLang's and the patched vLLM runner's msprobe step is one forward pass: [0] would dump only the
    first prefill (issue 35, item 2: vLLM got [0]), so the consistency generate config dumps every pass
    and says what the engine needs."""
    out = tmp_path / "g.json"
    args = ("config", "--mode", "consistency", "--side", "generate", "--dump-path", "/d/g", "-o", out, "--no-check")
    code, res = cli_json(*args, "--rollout-backend", "sglang")
    assert code == ExitCode.OK and json.loads(out.read_text())["step"] == [] and res["config"]["step"] == []
    needs = {n["key"].rsplit(".", 1)[-1]: n for n in res["pairing_needs"]}
    assert {k: n["value"] for k, n in needs.items()} == {
        "max_num_seqs": 1,
        "disable_radix_cache": True,
        "chunked_prefill_size": -1,
        "enforce_eager": True,
        "step": [],
    }
    assert all(n["why"] for n in needs.values()) and "per forward pass" in needs["step"]["why"]
    code, res = cli_json(*args, "--rollout-backend", "vllm")
    assert code == ExitCode.OK and res["config"]["step"] == []
    assert {n["key"].rsplit(".", 1)[-1]: n["value"] for n in res["pairing_needs"]} == {
        "max_num_seqs": 1,
        "enable_prefix_caching": False,
        "enable_chunked_prefill": False,
        "step": [],
    }
    code, res = cli_json(*args)  # no backend named: every pass, no engine settings listed
    assert code == ExitCode.OK and res["config"]["step"] == [] and res["pairing_needs"] == []
    code, res = cli_json("config", "--mode", "inference", *args[3:])
    assert code == ExitCode.OK and res["config"]["step"] == [0]  # inference: unchanged
    code, res = cli_json(*args[:4], "actor", *args[5:], "--rollout-backend", "sglang")
    assert code == ExitCode.OK and res["config"]["step"] == [] and res["pairing_needs"] == []

    # check-script's rule on an existing generate config: [0] warns for SGLang (only one pass pairs)
    data = build_config("consistency", "generate", "/d/g")
    (problem,) = rule_problems({**data, "step": [0]}, "consistency", "generate", "sglang")
    assert problem.startswith(SGLANG_STEP_WARNING) and "[0]" in problem
    assert rule_problems(data, "consistency", "generate", "sglang") == []
    assert rule_problems(data, "consistency", "generate", "vllm") == []
    (problem,) = rule_problems({**data, "step": [0]}, "consistency", "generate", "vllm")  # an error for vLLM
    assert not problem.startswith(SGLANG_STEP_WARNING) and "only the first pass" in problem, problem
    assert problem.endswith("config --mode consistency --side generate --rollout-backend vllm writes it)"), problem


def test_refusals(tmp_path: Path) -> None:
    out = tmp_path / "c.json"
    code, res = cli_json("config", "--mode", "training", "--dump-path", "/x", "-o", out, "--no-check")
    assert code == ExitCode.REFUSED and "forbidden" in res["message"]
    code, res = cli_json("config", "--mode", "consistency", "--side", "actor", "-o", out, "--no-check")
    assert code == ExitCode.REFUSED and "--dump-path is required" in res["message"]
    code, res = cli_json(
        "config", "--mode", "inference", "--side", "actor", "--dump-path", "/x", "-o", out, "--no-check"
    )
    assert code == ExitCode.REFUSED and "does not belong" in res["message"]
    code, res = cli_json("config", "--mode", "inference", "--dump-path", "/x", "--step", "a", "-o", out, "--no-check")
    assert code == ExitCode.USAGE
    assert not out.exists()


def test_without_msprobe_the_check_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "c.json"
    code, res = cli_json("config", "--mode", "inference", "--dump-path", "/x", "-o", out)  # this python: no msprobe
    assert code == ExitCode.REFUSED and "msprobe is not installed" in res["message"] and "--python" in res["hint"]
    assert not out.exists()
    code, res = cli_json("config", "--mode", "inference", "--dump-path", "/x", "-o", out, "--no-check")
    assert code == ExitCode.OK and json.loads(out.read_text())["step"] == [0]


def test_the_install_hint_names_the_training_python(tmp_path: Path) -> None:
    """Issue 35, item 7: the hint said `doctor --install`, which installs msprobe into this tool's venv (no
    torch there: msprobe cannot import). It names the training Python, with `doctor`'s own option."""
    out = tmp_path / "c.json"
    code, res = cli_json("config", "--mode", "inference", "--dump-path", "/x", "-o", out)
    assert code == ExitCode.REFUSED, res
    assert "rlprobe-patch doctor --install --python <the training python>" in res["hint"], res["hint"]
    code, res = cli_json("config", "--mode", "inference", "--dump-path", "/x", "-o", out, "--python", sys.executable)
    assert code == ExitCode.REFUSED, res
    assert f"rlprobe-patch doctor --install --python {sys.executable}" in res["hint"], res["hint"]
    doctor_help = cli("doctor", "--help").stdout
    assert "--install" in doctor_help and "--python PATH" in doctor_help  # the spelling the hint uses
    doctor = cli("doctor").stdout  # this interpreter: no msprobe, no torch
    assert "fix: rlprobe-patch doctor --install --python <the training python>" in doctor, doctor
