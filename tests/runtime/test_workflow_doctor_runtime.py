"""`rlprobe-patch doctor`: msprobe importable in the training interpreter; `--install` into a throwaway venv.

On a runtime venv and a fresh venv; without msprobe: tests/cli/test_workflow_doctor.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import cli_json

from rlprobe_patch.base.errors import ExitCode
from runtime import venvs


def test_runtime_venv_reports_versions_and_patch_states() -> None:
    python = venvs.ensure_runtime_venv("0.9.1")
    code, out = cli_json("doctor", "--python", python)
    assert code == ExitCode.OK, out
    assert out["msprobe"] == {"ok": True, "version": "26.2.0"}
    assert out["packages"]["torch"]["version"].startswith("2.13.0")
    assert out["verl"]["version"] == "0.9.1"
    states = {p["id"]: p["state"] for p in out["patches"]}
    assert "verl.fsdp-engine" in states and states["verl.fsdp-engine"] in ("applicable", "applied")


def test_install_into_a_throwaway_venv(tmp_path: Path) -> None:
    venv = tmp_path / "train-env"
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # the CPU torch from local disk first, so that msprobe's dependencies cannot pull a CUDA build
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", venvs.TORCH_PIN],
        check=True,
        stdin=subprocess.DEVNULL,
    )
    code, out = cli_json("doctor", "--python", python)
    assert code == ExitCode.VERIFY_FAILED and out["install"] is None

    code, out = cli_json("doctor", "--python", python, "--install", "--requirement", venvs.MSPROBE_PIN)
    assert code == ExitCode.OK, out
    assert out["install"]["ok"] and out["install"]["command"][-1] == venvs.MSPROBE_PIN
    assert out["msprobe"] == {"ok": True, "version": "26.2.0"}
    assert out["packages"]["torch"]["version"] == "2.13.0+cpu"
    check = subprocess.run(
        [str(python), "-c", "from msprobe.pytorch import PrecisionDebugger; print('OK')"],
        capture_output=True,
        text=True,
    )
    assert check.stdout.strip().endswith("OK")

    code, out = cli_json("doctor", "--python", python, "--install")  # already there: pip is not run again
    assert code == ExitCode.OK and out["install"] is None


def test_install_into_a_python_without_torch_names_the_training_python(tmp_path: Path) -> None:
    """Issue 29: msprobe installed where there is no torch does not import; doctor says it needs the training
    environment's torch and names the pip line, and config says msprobe could not be imported (it judged
    nothing) instead of "msprobe rejects the config"."""
    venv = tmp_path / "no-torch"
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    code, out = cli_json(
        "doctor", "--python", python, "--install", "--requirement", venvs.MSPROBE_PIN, "--pip-arg", "--no-deps"
    )
    assert code == ExitCode.VERIFY_FAILED and out["install"]["ok"], out
    assert out["packages"]["torch"]["found"] is False and "torch" in out["msprobe"]["error"]
    (advice,) = out["advice"]
    assert "needs the training environment's torch" in advice and str(python) in advice
    assert f"-m pip install {venvs.MSPROBE_PIN}" in advice

    config = tmp_path / "c.json"
    code, res = cli_json("config", "--mode", "inference", "--dump-path", "/x", "-o", config, "--python", python)
    assert code == ExitCode.REFUSED and not config.exists()
    assert "rejects" not in res["message"], res
    assert res["message"].startswith("msprobe 26.2.0 could not be imported in") and "torch" in res["message"]
    assert f"rlprobe-patch doctor --python {python}" in res["hint"]
