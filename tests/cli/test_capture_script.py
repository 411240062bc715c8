"""check-script on a run that captures log-probs (`verl.logprob-capture`, issue 30): the capture's
switches checked by the hooks' own reader, and what the run needs said before it is queued."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import cli_json, msprobe_configs

from rlprobe_patch.base.errors import ExitCode


def _capture_checks(script: Path) -> dict[str, dict]:
    _, out = cli_json("check-script", str(script), "--mode", "inference")
    return {
        c["name"] + "|" + c["detail"]: c for c in out["checks"] if "capture" in c["name"] or "MISMATCH" in c["name"]
    }


def _with(workflow_scripts: Path, exports: str, *overrides: str) -> Path:
    original = (workflow_scripts / "grpo_fsdp_vllm.sh").read_text()
    text = original.replace(
        "python3 -m verl.trainer.main_ppo \\\n", f"{exports}\npython3 -m verl.trainer.main_ppo \\\n"
    )
    text = text.replace(
        "    algorithm.use_kl_in_reward=False \\\n",
        "".join(f"    {o} \\\n" for o in overrides) + "    algorithm.use_kl_in_reward=False \\\n",
    )
    path = workflow_scripts / "capture.sh"
    path.write_text(text)
    return path


def test_no_capture_switch_no_capture_check(workflow_scripts: Path) -> None:
    assert _capture_checks(workflow_scripts / "grpo_fsdp_vllm.sh") == {}


def test_capture_without_rollout_log_probs_fails_before_the_run(workflow_scripts: Path) -> None:
    checks = _capture_checks(_with(workflow_scripts, "export MISMATCH_ON=1\nexport MISMATCH_DIR=/tmp/caps"))
    (failed,) = [c for c in checks.values() if not c["ok"]]
    assert failed["name"] == "log-prob capture: actor_rollout_ref.rollout.calculate_log_probs=True"
    assert "not set (verl's default False" in failed["detail"] and "stops at step 1" in failed["detail"]
    assert any(c["detail"] == "MISMATCH_DIR /tmp/caps" for c in checks.values())


def test_capture_in_bypass_mode_fails_before_the_run(workflow_scripts: Path) -> None:
    script = _with(
        workflow_scripts,
        "export MISMATCH_ON=true",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        "+algorithm.rollout_correction.bypass_mode=True",
    )
    checks = _capture_checks(script)
    failed = {c["name"] for c in checks.values() if not c["ok"]}
    assert failed == {"log-prob capture: algorithm.rollout_correction.bypass_mode=False"}


def test_a_capture_ready_run_passes(workflow_scripts: Path) -> None:
    script = _with(workflow_scripts, "export MISMATCH_ON=1", "actor_rollout_ref.rollout.calculate_log_probs=True")
    checks = _capture_checks(script)
    assert checks and all(c["ok"] for c in checks.values())


def test_a_wrong_capture_switch_value_is_named(workflow_scripts: Path) -> None:
    checks = _capture_checks(_with(workflow_scripts, "export MISMATCH_ON=sometimes"))
    (failed,) = [c for c in checks.values() if not c["ok"]]
    assert failed["name"] == "MISMATCH_ON value" and "'sometimes' is not a switch value" in failed["detail"]


def test_a_relative_mismatch_dir_is_said_to_leave_the_rollout_engine_without_records(workflow_scripts: Path) -> None:
    """vllm.rollout-record writes into MISMATCH_DIR/rollout from the engine's processes, whose working
    directory is not the trainer's: check-script says so where the folder is relative (unset: the default)."""
    for exports in ("export MISMATCH_ON=1", "export MISMATCH_ON=1\nexport MISMATCH_DIR=caps"):
        script = _with(workflow_scripts, exports, "actor_rollout_ref.rollout.calculate_log_probs=True")
        (said,) = [c for c in _capture_checks(script).values() if c["name"] == "log-prob capture: rollout record"]
        assert said["ok"] and said["warning"], said
        assert "not an absolute path" in said["detail"] and "writes no record" in said["detail"], said
    script = _with(workflow_scripts, "export MISMATCH_ON=1\nexport MISMATCH_DIR=/data/caps")
    assert not [c for c in _capture_checks(script).values() if c["name"] == "log-prob capture: rollout record"]


def test_the_capture_run_exports_an_absolute_mismatch_dir(
    workflow_scripts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`script --mode consistency` writes the capture run with MISMATCH_DIR absolute: the folder the
    trainer writes to from the directory the launch runs in (the script's own value, default
    rlprobe-logprobs), so that vLLM's processes write their records beside its capture. check-script
    holds a capture run to it: a relative one fails, naming the absolute folder to export; an absolute
    one of the script's own is kept as written."""
    configs = msprobe_configs(workflow_scripts / "configs")[:4]
    runs = tmp_path / "runs"
    runs.mkdir()
    monkeypatch.chdir(runs)
    for exports, folder in (("", runs / "rlprobe-logprobs"), ("export MISMATCH_DIR=caps", runs / "caps")):
        original = _with(workflow_scripts, exports) if exports else workflow_scripts / "grpo_fsdp_vllm.sh"
        derived = workflow_scripts / "derived.sh"
        code, out = cli_json("script", str(original), "--mode", "consistency", *configs, "-o", str(derived), "--force")
        assert code == ExitCode.OK, out
        assert out["capture"]["env"]["MISMATCH_DIR"] == str(folder), out["capture"]["env"]
        capture = workflow_scripts / "derived.capture.sh"
        assert f"export MISMATCH_DIR={folder}\n" in capture.read_text()
        monkeypatch.chdir(tmp_path)  # checked from elsewhere: the folder is absolute, the same
        code, checked = cli_json("check-script", str(capture), "--mode", "consistency")
        assert code == ExitCode.OK, [c for c in checked["checks"] if not c["ok"]]
        monkeypatch.chdir(runs)
    original = _with(workflow_scripts, 'export MISMATCH_DIR="$HOME/caps"')  # the script's own, absolute: kept
    code, out = cli_json("script", str(original), "--mode", "consistency", *configs, "-o", str(derived), "--force")
    assert code == ExitCode.OK and "MISMATCH_DIR" not in out["capture"]["env"], out["capture"]["env"]
    assert "MISMATCH_DIR=" not in capture.read_text().split("collection switches")[1]
    code, checked = cli_json("check-script", str(capture), "--mode", "consistency")
    assert code == ExitCode.OK, [c for c in checked["checks"] if not c["ok"]]
    capture.write_text(capture.read_text().replace('export MISMATCH_DIR="$HOME/caps"\n', "export MISMATCH_DIR=caps\n"))
    code, checked = cli_json("check-script", str(capture), "--mode", "consistency")
    failed = [c for c in checked["checks"] if not c["ok"]]
    assert code == ExitCode.VERIFY_FAILED and [c["name"] for c in failed] == [f"export MISMATCH_DIR={folder}"], failed
