"""`rlprobe-patch doctor` without msprobe: the fix it names, and an interpreter that is not there.

A runtime venv's report and `--install`: tests/runtime/test_workflow_doctor_runtime.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import cli_json

from rlprobe_patch.base.errors import ExitCode


def test_missing_msprobe_fails_with_a_fix(tmp_path: Path) -> None:
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    code, out = cli_json("doctor", "--python", venv / "bin" / "python")
    assert code == ExitCode.VERIFY_FAILED
    assert out["ok"] is False and out["msprobe"]["error"] == "msprobe is not installed"
    assert out["packages"]["torch"]["found"] is False
    assert out["verl"]["found"] is False and "cannot import verl" in out["verl"]["reason"]


def test_no_such_interpreter(tmp_path: Path) -> None:
    code, out = cli_json("doctor", "--python", tmp_path / "nope" / "python")
    assert code == ExitCode.REFUSED and "no such interpreter" in out["message"]
