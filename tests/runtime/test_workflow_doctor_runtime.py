"""`rlprobe-patch doctor`: msprobe importable in the training interpreter; `--install` into a throwaway venv
(a hard-linked copy of a cached venv with torch and msprobe's dependencies, without msprobe).

On a runtime venv and a fresh venv; without msprobe: tests/cli/test_workflow_doctor.py.
"""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path

import pytest
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


def _prefix_and_purelib(python: Path) -> list[str]:
    script = "import sys, sysconfig; print(sys.prefix); print(sysconfig.get_paths()['purelib'])"
    proc = subprocess.run([str(python), "-I", "-c", script], capture_output=True, text=True, check=True)
    return proc.stdout.split()


@pytest.mark.parametrize("links", [True, False], ids=["hard-links", "another-filesystem"])
def test_hardlinked_copy_is_a_venv_of_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, links: bool) -> None:
    """`venvs.hardlinked_copy`: the copy's python has the copy as prefix; files are shared by hard links, or
    copied where `os.link` fails (EXDEV, another filesystem)."""
    base = tmp_path / "base"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(base)], check=True)
    base_site = venvs.site_packages(venvs.venv_python(base))
    (base_site / "probe_module.py").write_text("VALUE = 1\n")
    if not links:

        def no_link(src: str, dst: str) -> None:
            raise OSError(errno.EXDEV, "Invalid cross-device link")

        monkeypatch.setattr(venvs.os, "link", no_link)
    copy = tmp_path / "copy"
    python = venvs.hardlinked_copy(base, copy)
    copy_site = copy / base_site.relative_to(base)
    assert _prefix_and_purelib(python) == [str(copy), str(copy_site)]
    assert python.is_symlink() and (copy / "pyvenv.cfg").is_file()
    shared = (copy_site / "probe_module.py").stat().st_ino == (base_site / "probe_module.py").stat().st_ino
    assert shared is links


def test_install_into_a_throwaway_venv(tmp_path: Path) -> None:
    """`doctor --install` on a training environment without msprobe: it fails first (install None), then
    its pip installs msprobe, which imports there, and a second `--install` does not run pip again.

    The environment holds what a training venv has (CPU torch and the usual scientific packages: here every
    dependency of msprobe), built once and cached (`venvs.ensure_doctor_base_venv`); the test's venv is a
    hard-linked copy of it, so that doctor's pip installs mindstudio-probe alone: doctor's behaviour is what
    is under test, not pip's download of pandas and matplotlib. The cache is left without msprobe."""
    base = venvs.ensure_doctor_base_venv()
    base_venv, base_site = base.parent.parent, venvs.site_packages(base)
    base_listing = sorted(p.name for p in base_site.iterdir())
    venv = tmp_path / "train-env"
    python = venvs.hardlinked_copy(base_venv, venv)
    # the copy is its own environment: its prefix and site-packages, not the cache's
    assert _prefix_and_purelib(python) == [str(venv), str(venv / base_site.relative_to(base_venv))]

    code, out = cli_json("doctor", "--python", python)
    assert code == ExitCode.VERIFY_FAILED and out["install"] is None

    code, out = cli_json("doctor", "--python", python, "--install", "--requirement", venvs.MSPROBE_PIN)
    assert code == ExitCode.OK, out
    assert out["install"]["ok"] and out["install"]["command"][-1] == venvs.MSPROBE_PIN
    assert out["msprobe"] == {"ok": True, "version": "26.2.0"}
    assert out["packages"]["torch"]["version"] == "2.13.0+cpu"
    check = subprocess.run(
        [str(python), "-c", "import msprobe; from msprobe.pytorch import PrecisionDebugger; print(msprobe.__file__)"],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stderr
    assert Path(check.stdout.strip()).is_relative_to(venv)  # pip installed into the copy

    code, out = cli_json("doctor", "--python", python, "--install")  # already there: pip is not run again
    assert code == ExitCode.OK and out["install"] is None

    # the cached venv did not change: still no msprobe, the same site-packages
    assert venvs.doctor_base_has_msprobe(base) == {"torch": "2.13.0+cpu", "msprobe": False, "dist": False}
    assert sorted(p.name for p in base_site.iterdir()) == base_listing


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
