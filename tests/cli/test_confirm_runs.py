"""Issue 42, item 2: a `confirm:` line is a run that differs from the user's consistency script in exactly the
setting it names, or it is not printed (`src/rlprobe_patch/report/confirm.py`).

The launch script is our workflow fixture `grpo_fsdp_vllm.sh` (vLLM rollout, FSDP2, no sampling setting of its
own) and variants of it; each printed line is run as printed and the script it writes is compared, setting by
setting, with the plain consistency script of the same launch script.
"""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import pytest
from conftest import WORKFLOW_SCRIPTS, cli
from printed import printed_commands

from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.catalogue.releases import releases
from rlprobe_patch.launch.script import read_script
from rlprobe_patch.report.confirm import confirm_lines, confirming_keys, sampling_of
from rlprobe_patch.workflow.derive import consistency_settings

CAUSES = sorted({c.cause for c in releases("verl").confirms})


def _run(tmp_path: Path, extra: str = "") -> Path:
    script = tmp_path / "run_grpo.sh"
    shutil.copy(WORKFLOW_SCRIPTS / "grpo_fsdp_vllm.sh", script)
    if extra:
        script.write_text(script.read_text().replace("trainer.total_epochs=15", f"trainer.total_epochs=15 {extra}"))
    return script


def _confirm(cause: str, script: str | None, sampling: dict | None = None) -> tuple[str, ...]:
    """The lines the report prints: what a consistency script of `script` sets, asked of the workflow as the
    report command asks it (`report.make.make_report`'s `consistency`)."""
    plain = consistency_settings(script, confirming_keys()) if script else None
    return confirm_lines(cause, script, plain, sampling)


def _settings(path: Path) -> dict[str, object]:
    """The launch's settings as the derived script sets them, without what names its own msprobe configs."""
    script = read_script(path)
    configs = {p.name for p in path.parent.glob(f"{path.stem}.*.json")}
    return {k: s.value for k, s in script.settings.items() if Path(str(s.value)).name not in configs}


def test_a_line_is_a_run_of_the_script_with_one_setting_changed(tmp_path: Path, monkeypatch) -> None:
    """Every cause's lines on the fixture, run as printed (and the check-script lines they print): each derived
    script differs from the plain consistency script in its one setting, and in nothing else."""
    monkeypatch.chdir(tmp_path)
    script = _run(tmp_path)
    plain = cli("script", script.name, "--mode", "consistency", "-o", "plain.sh")
    assert plain.exit_code == ExitCode.OK, plain.output
    base = _settings(tmp_path / "plain.sh")
    ran = 0
    seen: set[tuple[str, ...]] = set()
    for cause in CAUSES:
        for line in _confirm(cause, script.name):
            command = shlex.split(line, comments=True)
            if tuple(command) in seen:  # one setting that confirms two causes (the rollout in float32): one run
                continue
            seen.add(tuple(command))
            key, _, value = command[command.index("--set") + 1].partition("=")
            result = cli(*command[1:])
            assert result.exit_code == ExitCode.OK, (line, result.output)
            for follow in printed_commands(result.output):
                assert cli(*follow[1:]).exit_code == ExitCode.OK, (follow, line)
            derived = _settings(tmp_path / command[command.index("-o") + 1])
            differ = {k for k in base.keys() | derived.keys() if base.get(k) != derived.get(k)}
            assert differ == {key} and str(derived[key]) == value, (line, differ)
            ran += 1
    assert ran >= 3  # logprob-kind's two, token-mismatch's, the tail's: what the fixture does not set already


@pytest.mark.parametrize(
    ("cause", "sampling", "extra", "keys"),
    [
        # a plain consistency script already runs eager, and (vLLM) without the prefix cache: no run of its own
        ("broken-layer", None, "", []),
        ("stale-weights", None, "", []),
        # the capture recorded processed log-probs: the run already had them (issue 42: the temperature report)
        ("logprob-kind", {"temperature": 0.7, "logprobs_mode": "processed_logprobs"}, "", ["temperature"]),
        ("logprob-kind", None, "", ["logprobs_mode", "temperature"]),
        # the script already samples at T 1: nothing to change
        ("logprob-kind", None, "actor_rollout_ref.rollout.temperature=1.0", ["logprobs_mode"]),
    ],
)
def test_a_setting_the_run_has_is_no_line(
    tmp_path: Path, cause: str, sampling: dict | None, extra: str, keys: list[str]
) -> None:
    lines = _confirm(cause, str(_run(tmp_path, extra)), sampling)
    assert [shlex.split(line, comments=True)[6].split("=")[0].rsplit(".", 1)[-1] for line in lines] == keys


def test_no_line_without_a_script_that_derives(tmp_path: Path) -> None:
    """No launch script: no run to name (the report's `next:` says to give one); a script `script` would refuse
    (its rollout unknown): no line either, since it would not run as printed."""
    assert _confirm("logprob-kind", None) == ()
    bare = tmp_path / "bare.sh"
    bare.write_text("python3 -m verl.trainer.main_ppo trainer.total_epochs=1\n")
    assert consistency_settings(str(bare), confirming_keys()) is None
    assert _confirm("logprob-kind", str(bare)) == ()
    assert cli("script", bare, "--mode", "consistency", "--dry-run").exit_code == ExitCode.REFUSED


def test_the_sampling_of_the_step_that_shows_the_cause() -> None:
    steps = [
        {"sampling": {"temperature": 1.0}, "causes": [{"cause": "logprob-kind", "score": 0.0, "fit": 0.1}]},
        {"sampling": {"temperature": 0.7}, "causes": [{"cause": "logprob-kind", "score": 1.0, "fit": 1.0}]},
    ]
    assert sampling_of(steps, "logprob-kind") == {"temperature": 0.7}
    assert sampling_of(steps, "token-mismatch") is None
