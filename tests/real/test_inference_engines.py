"""SGLang and vLLM-Ascend patches on the real packages from the index.

Each patched release: apply, verify (our syntax-tree checks; for vLLM-Ascend also the skill's
check-consistency-patch vLLM rules), py_compile, a second apply that writes nothing, and a
revert that leaves every file byte-identical (the added dispatch_logger.py is removed).
SGLang 0.5.11 and later dump natively: `--mode inference` writes nothing and prints the verl
argument; the dispatch logger (`--mode consistency`, or the tree named alone) goes in on every
release, beside sglang.model-runner's debugger below 0.5.11 and SGLang's own from it.
"""

from __future__ import annotations

import py_compile

import pytest
from conftest import SGLANG_MEMBERS, cli, cli_json, package_wheel, snapshot, unpack
from packaging.version import Version

from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.catalogue.patches import get_patch
from rlprobe_patch.catalogue.releases import releases

# The releases come from the release data (patches/releases/sglang.toml, vllm-ascend.toml).
SGLANG = releases("sglang")
SGLANG_PATCHED = [r for r in SGLANG.tested if not SGLANG.is_native(Version(r))]
SGLANG_NATIVE = [r for r in SGLANG.tested if SGLANG.is_native(Version(r))]
VLLM_ASCEND_PATCHED = releases("vllm_ascend").tested
VLLM_ASCEND_REFUSED = releases("vllm_ascend").refused


def cycle(root, option: str, expected_files: list[str], *extra: str) -> dict:
    original = snapshot(root)
    code, out = cli_json("apply", option, root, *extra)
    assert code == ExitCode.OK, out
    assert out["status"] == "applied" and out["files"] == expected_files
    for path in expected_files:
        py_compile.compile(str(root / path), doraise=True, cfile=str(root.parent / "c.pyc"))
    code, verified = cli_json("verify", option, root)
    assert code == ExitCode.OK, [c for t in verified["trees"] for c in t["checks"] if not c["ok"]]
    patched = snapshot(root)
    code, again = cli_json("apply", option, root, *extra)
    assert code == ExitCode.OK and again["status"] == "already applied"
    assert snapshot(root) == patched
    assert cli_json("revert", option, root)[0] == ExitCode.OK
    assert snapshot(root) == original
    return verified


def logger_files(version: str) -> list[str]:
    """The files sglang.dispatch-logger writes on `version` (forward_batch_info.py on 0.5.8 and 0.5.9)."""
    return sorted(s.target for s in get_patch("sglang.dispatch-logger").sites_for(Version(version)))


@pytest.mark.parametrize("version", SGLANG_PATCHED)
def test_sglang_model_runner(sglang_tree, tmp_path, version: str) -> None:
    root = sglang_tree(version)
    verified = cycle(root, "--sglang-root", logger_files(version), "--mode", "consistency")
    checks = [c["check"] for c in verified["trees"][0]["checks"] if c["ok"]]
    assert any("sglang.model-runner: hooks in place" in c for c in checks), checks
    assert any("sglang.dispatch-logger: hooks in place" in c for c in checks), checks
    # The debugger alone (`--mode inference`): the model runner's hooks, no dispatch log.
    root = unpack(package_wheel("sglang", version), tmp_path / "inference", SGLANG_MEMBERS)
    cycle(root, "--sglang-root", ["sglang/srt/model_executor/model_runner.py"], "--mode", "inference")


@pytest.mark.parametrize("version", SGLANG.tested)
def test_sglang_dispatch_logger_state(sglang_tree, version: str) -> None:
    """`status` and `verify` name the logger's state on every release, native ones included."""
    root = sglang_tree(version)
    assert cli_json("apply", "--sglang-root", root, "--mode", "consistency")[0] == ExitCode.OK
    _, status = cli_json("status", "--sglang-root", root)
    states = {p["id"]: p["state"] for p in status["trees"][0]["patches"]}
    assert states["sglang.dispatch-logger"] == "applied"
    text = cli("verify", "--sglang-root", root).stdout
    assert "PASS  sglang.dispatch-logger: hooks in place in sglang/srt/model_executor/model_runner.py" in text
    assert "PASS  sglang.dispatch-logger: sglang/srt/model_executor/dispatch_logger.py added" in text


@pytest.mark.parametrize("version", SGLANG_NATIVE)
def test_sglang_native_releases_get_nothing(sglang_tree, version: str) -> None:
    root = sglang_tree(version)
    original = snapshot(root)
    code, out = cli_json("apply", "--sglang-root", root, "--mode", "inference")
    assert code == ExitCode.OK
    (patch,) = out["patches"]
    assert patch["state"] == "native" and out["files"] == []
    assert "++actor_rollout_ref.rollout.engine_kwargs.sglang.msprobe_dump_config=PATH" in patch["native"]
    text = cli("apply", "--sglang-root", root, "--mode", "inference").stdout
    assert "dumps with msprobe itself" in text and "nothing to write" in text
    assert snapshot(root) == original and not (root / ".rlprobe-patch").exists()


@pytest.mark.parametrize("version", SGLANG_NATIVE)
def test_sglang_native_releases_get_the_dispatch_logger(sglang_tree, version: str) -> None:
    """Next to SGLang's own debugger: the logger alone is written (the model runner stays native)."""
    root = sglang_tree(version)
    cycle(root, "--sglang-root", logger_files(version), "--mode", "consistency")
    _, out = cli_json("apply", "--sglang-root", root, "--mode", "consistency", "--dry-run")
    states = {p["id"]: p["state"] for p in out["patches"]}
    assert states == {"sglang.dispatch-logger": "applicable", "sglang.model-runner": "native"}


@pytest.mark.parametrize("version", VLLM_ASCEND_PATCHED)
def test_vllm_ascend_dispatch_logger(vllm_ascend_tree, version: str) -> None:
    root = vllm_ascend_tree(version)
    verified = cycle(
        root,
        "--vllm-ascend-root",
        ["vllm_ascend/worker/dispatch_logger.py", "vllm_ascend/worker/model_runner_v1.py"],
    )
    assert verified["trees"][0]["skill"] == [
        f"PASS: {root / 'vllm_ascend/worker/dispatch_logger.py'}",
        f"PASS: {root / 'vllm_ascend/worker/model_runner_v1.py'}",
    ]


@pytest.mark.parametrize("version", VLLM_ASCEND_REFUSED)
def test_vllm_ascend_before_native_dumping_is_refused(vllm_ascend_tree, version: str) -> None:
    root = vllm_ascend_tree(version)
    original = snapshot(root)
    code, out = cli_json("apply", "--vllm-ascend-root", root)
    assert code == ExitCode.REFUSED
    assert "has no msprobe dump support (added in 0.12.0rc1" in " ".join(out["details"])
    assert snapshot(root) == original


def test_only_the_named_tree_is_patched(vllm_ascend_tree, monkeypatch) -> None:
    """`--vllm-ascend-root V --mode consistency` patches V alone: no verl is searched for."""
    monkeypatch.setenv("PYTHONPATH", "")  # even if this Python could import a verl, it is not looked for
    root = vllm_ascend_tree("0.13.0")
    code, out = cli_json("apply", "--vllm-ascend-root", root, "--mode", "consistency")
    assert code == ExitCode.OK
    assert [t["tree"]["package"] for t in out["trees"]] == ["vllm_ascend"]
    code, status = cli_json("status", "--vllm-ascend-root", root)
    assert [p["state"] for p in status["trees"][0]["patches"]] == ["applied"]
    assert cli_json("revert", "--vllm-ascend-root", root)[0] == ExitCode.OK


def test_three_trees_at_once(real_tree, sglang_tree, vllm_ascend_tree) -> None:
    verl, sglang, vllm = real_tree("0.9.1"), sglang_tree("0.5.8"), vllm_ascend_tree("0.18.0")
    originals = [snapshot(r) for r in (verl, sglang, vllm)]
    code, out = cli_json(
        "apply",
        "--verl-root",
        verl,
        "--sglang-root",
        sglang,
        "--vllm-ascend-root",
        vllm,
        "--backend",
        "megatron",
        "--mode",
        "consistency",
    )
    assert code == ExitCode.OK, out
    assert [t["status"] for t in out["trees"]] == ["applied", "applied", "applied"]
    code, verified = cli_json("verify")  # the registry knows all three
    assert code == ExitCode.OK
    assert len(verified["trees"]) == 3
    skill = next(t for t in verified["trees"] if t["tree"]["package"] == "verl")["skill"]
    assert f"PASS: {vllm / 'vllm_ascend/worker/dispatch_logger.py'}" in skill  # the skill's vLLM rules ran
    assert cli_json("revert")[0] == ExitCode.OK
    assert [snapshot(r) for r in (verl, sglang, vllm)] == originals
