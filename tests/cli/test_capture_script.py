"""check-script on a run that captures log-probs (`verl.logprob-capture`, issue 30): the capture's
switches checked by the hooks' own reader, and what the run needs said before it is queued."""

from __future__ import annotations

from pathlib import Path

from conftest import cli_json


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
