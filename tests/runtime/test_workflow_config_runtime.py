"""`rlprobe-patch config`: msprobe's own loading of the file, in a runtime venv (the skill's rules:
tests/cli/test_workflow_config.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import cli_json

from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.workflow.config import build_config, check_with_msprobe
from runtime import venvs


@pytest.mark.parametrize(
    ("mode", "side", "extra"),
    [
        ("training", "training", ()),
        # inference's and SGLang's generate configs: the exhaustive leg's (issue 35), ~9 s each in msprobe
        pytest.param("inference", "generate", ("--dump-path", "DUMP"), marks=pytest.mark.exhaustive),
        ("consistency", "generate", ("--dump-path", "DUMP")),
        pytest.param(
            "consistency",
            "generate",
            ("--dump-path", "DUMP", "--rollout-backend", "sglang"),  # step []
            marks=pytest.mark.exhaustive,
        ),
        ("consistency", "actor", ("--dump-path", "DUMP", "--level", "L0", "--task", "tensor", "--rank", "0,1")),
    ],
)
def test_configs_load_in_msprobe(tmp_path: Path, mode: str, side: str, extra: tuple[str, ...]) -> None:
    python = venvs.ensure_runtime_venv("0.9.1")
    out = tmp_path / f"config_{side}.json"
    args = [str(tmp_path / "dump") if a == "DUMP" else a for a in extra]
    code, res = cli_json("config", "--mode", mode, "--side", side, *args, "-o", out, "--python", python)
    assert code == ExitCode.OK, res
    check = res["msprobe_check"]
    assert check["ok"] and check["msprobe"] == "26.2.0"
    written = json.loads(out.read_text())
    assert check["level"] == written["level"] and check["step"] == written["step"] and check["task"] == written["task"]
    if side == "actor":
        assert check["rank"] == [0, 1] and check["level"] == "L0"
    assert (out.stat().st_mode & 0o777) == 0o640
    # and the same file through PrecisionDebugger(config_path=...) itself
    code_text = (
        "import sys\nfrom msprobe.pytorch import PrecisionDebugger\n"
        "d = PrecisionDebugger(config_path=sys.argv[1], dump_path=sys.argv[2])\n"
        "print('LEVEL', d.config.level, 'STEP', d.config.step)\n"
    )
    proc = subprocess.run(
        [str(python), "-c", code_text, str(out), str(tmp_path / "pd")], capture_output=True, text=True, timeout=300
    )
    assert f"LEVEL {written['level']} STEP {written['step']}" in proc.stdout, proc.stderr[-2000:]


def test_msprobe_rejections_are_reported(tmp_path: Path) -> None:
    python = venvs.ensure_runtime_venv("0.9.1")
    bad = tmp_path / "bad.json"
    data = build_config("inference", "generate", "/d")
    data["statistics"]["data_mode"] = ["all", "input"]  # msprobe: 'all' cannot be combined
    bad.write_text(json.dumps(data))
    bad.chmod(0o640)
    result = check_with_msprobe(bad, str(python), training=False)
    assert result["ok"] is False and "MsprobeException" in result["error"]
    assert any("'all' cannot be combined" in line for line in result["log"])
    data = build_config("consistency", "actor", "/d")
    del data["dump_path"]  # PrecisionDebugger would say "The dump_path not found."
    bad.write_text(json.dumps(data))
    result = check_with_msprobe(bad, str(python), training=False)
    assert result["ok"] is False and "dump_path not found" in result["error"]
