"""Which verl worker path apply hooks (issue: legacy workers), decided from the release and the script."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import cli, cli_json

from rlprobe_patch.base.errors import ExitCode


@pytest.mark.parametrize(
    ("version", "script", "expected"),
    [
        ("0.6.1", None, "legacy"),
        ("0.7.1", None, "legacy"),
        ("0.7.1", "python3 -m verl.trainer.main_ppo \\\n    trainer.use_legacy_worker_impl=disable \\\n", "engine"),
        ("0.7.1", "python3 -m verl.trainer.main_ppo trainer.use_legacy_worker_impl='enable'\n", "legacy"),
        ("0.8.0", None, "engine"),
    ],
)
def test_auto_worker_path(real_tree, tmp_path: Path, version: str, script: str | None, expected: str) -> None:
    root = real_tree(version)
    args = ["apply", "--verl-root", root, "--backend", "megatron"]
    if script is not None:
        (tmp_path / "run.sh").write_text(script)
        args += ["--script", tmp_path / "run.sh"]
    code, out = cli_json(*args)
    assert code == ExitCode.OK, out
    assert out["worker_path"]["impl"] == expected
    hook = {"legacy": "verl.legacy-megatron-workers", "engine": "verl.megatron-engine"}[expected]
    assert [p["id"] for p in out["patches"]] == [hook]
    if version.startswith("0.7") and script is None:
        assert "trainer.use_legacy_worker_impl=auto" in out["worker_path"]["why"]
        assert "--worker-impl engine" in out["worker_path"]["why"]  # says what to do if the run differs
    text = cli("status", "--verl-root", root).stdout
    assert f"worker path hooked: {expected}" in text
    code, verified = cli_json("verify", "--verl-root", root)
    assert code == ExitCode.OK, [c for c in verified["trees"][0]["checks"] if not c["ok"]]
    assert {"check": "worker path hooked", "ok": True, "detail": expected, "warning": False} in verified["trees"][0][
        "checks"
    ]
    assert cli_json("revert", "--verl-root", root)[0] == ExitCode.OK


def test_legacy_with_the_consistency_set(real_tree) -> None:
    """0.7.1 by default: the legacy hook plus the consistency set; the skill's engine-file rule is
    expected to fail there (the legacy workers are hooked) and does not fail verify."""
    root = real_tree("0.7.1")
    code, out = cli_json("apply", "--verl-root", root, "--backend", "fsdp", "--mode", "consistency")
    assert code == ExitCode.OK, out
    assert "verl.legacy-fsdp-workers" in [p["id"] for p in out["patches"]]
    code, verified = cli_json("verify", "--verl-root", root)
    assert code == ExitCode.OK, [c for c in verified["trees"][0]["checks"] if not c["ok"]]
    assert any(line.startswith("FAIL: ") and "engine/fsdp" in line for line in verified["trees"][0]["skill"])


ARRAY_SCRIPT = """#!/usr/bin/env bash
set -euo pipefail
LEGACY=${LEGACY:-auto}
TRAINER=(
    trainer.n_gpus_per_node=8
    trainer.use_legacy_worker_impl=${LEGACY}
)
python3 -m verl.trainer.main_ppo "${TRAINER[@]}" "$@"
"""


@pytest.mark.parametrize(
    ("files", "extra", "expected", "source"),
    [
        ({"run.sh": ARRAY_SCRIPT.replace("${LEGACY:-auto}", "disable")}, [], "engine", "run.sh:6"),
        ({"run.sh": ARRAY_SCRIPT}, [], "legacy", "run.sh:6"),
        ({"run.sh": ARRAY_SCRIPT}, ["--env", "LEGACY=disable"], "engine", "run.sh:6"),
        ({"run.sh": ARRAY_SCRIPT}, ["--arg", "trainer.use_legacy_worker_impl=disable"], "engine", "--arg"),
        (
            {
                "common.sh": "WORKERS=(trainer.use_legacy_worker_impl=disable)\n",
                "run.sh": 'source "$(dirname "$0")/common.sh"\npython3 -m verl.trainer.main_ppo "${WORKERS[@]}"\n',
            },
            [],
            "engine",
            "common.sh:1",
        ),
        ({"run.sh": "python3 -m verl.trainer.main_ppo trainer.nnodes=1\n"}, [], "legacy", "ppo_trainer.yaml"),
    ],
)
def test_worker_path_from_the_script_as_bash_and_hydra_read_it(
    real_tree, tmp_path: Path, files: dict[str, str], extra: list[str], expected: str, source: str
) -> None:
    """verl 0.7.1: `disable` in an array, a sourced file, through --env or the script's arguments
    hooks the engine workers; `auto` (set or verl's default) hooks the legacy ones, saying where from."""
    root = real_tree("0.7.1")
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    code, out = cli_json("apply", "--verl-root", root, "--backend", "fsdp", "--script", tmp_path / "run.sh", *extra)
    assert code == ExitCode.OK, out
    assert out["worker_path"]["impl"] == expected
    assert source in out["worker_path"]["why"]
    hook = {"legacy": "verl.legacy-fsdp-workers", "engine": "verl.fsdp-engine"}[expected]
    assert [p["id"] for p in out["patches"]] == [hook]


def test_a_script_verl_would_refuse_is_refused_before_patching(real_tree, tmp_path: Path) -> None:
    root = real_tree("0.7.1")
    (tmp_path / "run.sh").write_text("python3 -m verl.trainer.main_ppo trainer.no_such_key=1\n")
    code, out = cli_json("apply", "--verl-root", root, "--backend", "fsdp", "--script", tmp_path / "run.sh")
    assert code == ExitCode.REFUSED
    assert any("run.sh:1" in d and "no_such_key" in d for d in out["details"]), out
    assert not (root / ".rlprobe-patch").exists()


@pytest.mark.parametrize("use_v1", [None, "True", "False"])
def test_no_v1_trainer_warning_where_the_v1_trainer_is_patched(real_tree, tmp_path: Path, use_v1: str | None) -> None:
    """verl 0.9.1 runs the V1 trainer unless the run sets trainer.use_v1=False; both trainers are
    patched (`PPOTrainer._step_once` and `RayPPOTrainer.fit`), so no run is told to leave V1."""
    root = real_tree("0.9.1")
    args = ["apply", "--verl-root", root, "--backend", "fsdp", "--mode", "consistency"]
    if use_v1 is not None:
        launch = 'python3 -m verl.trainer.main_ppo "${T[@]}"\n'
        (tmp_path / "run.sh").write_text(f"T=(trainer.use_v1={use_v1})\n" + launch)
        args += ["--script", tmp_path / "run.sh"]
    code, out = cli_json(*args)
    assert code == ExitCode.OK, out
    assert [w for p in out["patches"] for w in p.get("warnings", []) if "use_v1" in w] == []
    prompts_only = next(p for p in out["patches"] if p["id"] == "verl.prompts-only")
    assert "verl/trainer/ppo/v1/trainer_base.py" in prompts_only["targets"], prompts_only


def test_verify_with_the_script_catches_the_wrong_worker_path(real_tree, tmp_path: Path) -> None:
    """0.7.1 patched by default (legacy hooks), run by a script that sets disable in an array: verify
    --script fails (the run would dump nothing); with the script's default it passes."""
    root = real_tree("0.7.1")
    assert cli_json("apply", "--verl-root", root, "--backend", "fsdp")[0] == ExitCode.OK
    (tmp_path / "run.sh").write_text(ARRAY_SCRIPT)
    code, out = cli_json("verify", "--verl-root", root, "--script", tmp_path / "run.sh")
    assert code == ExitCode.OK, out
    code, out = cli_json("verify", "--verl-root", root, "--script", tmp_path / "run.sh", "--env", "LEGACY=disable")
    assert code == ExitCode.VERIFY_FAILED
    failed = [c for c in out["trees"][0]["checks"] if not c["ok"]]
    assert [c["check"] for c in failed] == ["worker path of run.sh"]
    assert "run.sh:6" in failed[0]["detail"] and "dump nothing" in failed[0]["detail"]


@pytest.mark.parametrize(
    ("overrides", "told"),
    [
        (None, True),  # no script: the run's PP is unknown, apply says what a step is on a pipeline
        ("actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=1", False),
        ("actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2", True),
        ("actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size=2", True),
    ],
)
def test_the_pipeline_notice_reads_the_script(real_tree, tmp_path: Path, overrides: str | None, told: bool) -> None:
    """With --script, apply explains the steps of pipeline stages only when the run has PP or VPP > 1."""
    root = real_tree("0.9.1")
    args = ["apply", "--verl-root", root, "--backend", "megatron", "--dry-run"]
    if overrides is not None:
        launch = "python3 -m verl.trainer.main_ppo --config-name=ppo_megatron_trainer "
        (tmp_path / "run.sh").write_text(launch + overrides + "\n")
        args += ["--script", tmp_path / "run.sh"]
    code, out = cli_json(*args)
    assert code == ExitCode.OK, out
    notices = [n for p in out["patches"] for n in p.get("notices", [])]
    assert any("virtual pipeline, a step holds one micro-batch" in n for n in notices) is told, notices
