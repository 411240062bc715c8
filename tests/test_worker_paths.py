"""Which verl worker path apply hooks (issue: legacy workers), decided from the release and the script."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import cli, cli_json

from rlprobe_patch.errors import ExitCode

pytestmark = pytest.mark.real


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
