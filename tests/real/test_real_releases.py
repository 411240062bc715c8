"""The compatibility matrix of the engine patches, proven on the real verl releases.

Each cell (release x backend): apply, verify (our syntax-tree checks and the skill's
check-engine-patch rules), py_compile of the touched files, a second apply that writes
nothing, and a revert that leaves every file byte-identical with its mode.
"""

from __future__ import annotations

import py_compile

import pytest
import unidiff
from conftest import REFUSED_RELEASES, VERL_RELEASES, cli, cli_json, snapshot
from packaging.version import Version

from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.catalogue.patches import select

ENGINE_FILE = {
    "fsdp": "verl/workers/engine/fsdp/transformer_impl.py",
    "megatron": "verl/workers/engine/megatron/transformer_impl.py",
}


@pytest.mark.parametrize("backend", ["fsdp", "megatron"])
@pytest.mark.parametrize("version", VERL_RELEASES)
def test_engine_patch_cell(real_tree, version: str, backend: str) -> None:
    root = real_tree(version)
    original = snapshot(root)
    target = root / ENGINE_FILE[backend]
    target.chmod(0o640)  # an unusual mode must survive apply and revert
    original[ENGINE_FILE[backend]] = (original[ENGINE_FILE[backend]][0], 0o640)

    code, out = cli_json("apply", "--verl-root", root, "--backend", backend, "--worker-impl", "engine")
    assert code == ExitCode.OK, out
    assert out["status"] == "applied"
    assert out["tree"]["version"] == version
    assert out["files"] == [ENGINE_FILE[backend]]
    assert target.stat().st_mode & 0o7777 == 0o640
    py_compile.compile(str(target), doraise=True, cfile=str(root.parent / "compiled.pyc"))

    # The record: a unified diff with provenance that unidiff parses.
    diff_text = (root / ".rlprobe-patch" / out["diff_file"].split(".rlprobe-patch/")[1]).read_text()
    assert f"# Package: verl {version}" in diff_text
    assert "# Patches: verl." in diff_text
    patch = unidiff.PatchSet(diff_text)
    assert [f.path for f in patch] == [ENGINE_FILE[backend]]
    assert patch[0].removed == 0 and patch[0].added > 20

    code, out = cli_json("verify", "--verl-root", root)
    assert code == ExitCode.OK, [c for t in out["trees"] for c in t["checks"] if not c["ok"]]
    names = [c["check"] for c in out["trees"][0]["checks"]]
    assert any(n.startswith("recorded diff reverse-applies") for n in names)  # git apply --check -R
    assert any("hooks in place" in n for n in names)
    assert out["trees"][0]["skill"] == [f"PASS: {target}"]

    skill_backend = "megatron" if backend == "megatron" else "fsdp"
    result = cli("check-engine-patch", "--verl-root", root, "--backend", skill_backend)
    assert result.exit_code == 0 and result.stdout == f"PASS: {target}\n"

    patched = snapshot(root)
    code, out = cli_json("apply", "--verl-root", root, "--backend", backend, "--worker-impl", "engine")
    assert code == ExitCode.OK and out["status"] == "already applied" and out["files"] == []
    assert snapshot(root) == patched

    code, out = cli_json("revert", "--verl-root", root)
    assert code == ExitCode.OK, out
    assert out["trees"][0]["files"] == [ENGINE_FILE[backend]]
    assert snapshot(root) == original


@pytest.mark.parametrize("version", VERL_RELEASES)
def test_both_engines_then_one_revert(real_tree, version: str) -> None:
    """Two applies on one tree are two records; revert undoes both, in reverse order."""
    root = real_tree(version)
    original = snapshot(root)
    for backend in ("fsdp", "megatron"):
        assert cli_json("apply", "--verl-root", root, "--backend", backend, "--worker-impl", "engine")[0] == ExitCode.OK
    code, out = cli_json("status", "--verl-root", root)
    states = {p["id"]: p["state"] for p in out["trees"][0]["patches"]}
    assert states["verl.fsdp-engine"] == "applied" and states["verl.megatron-engine"] == "applied"
    assert {states[i] for i in states if i not in ("verl.fsdp-engine", "verl.megatron-engine")} <= {
        "applicable",
        "not for this release",
    }
    code, out = cli_json("revert")  # no arguments: the registry knows the tree
    assert code == ExitCode.OK and len(out["trees"][0]["reverted"]) == 2
    assert snapshot(root) == original


@pytest.mark.parametrize("version", REFUSED_RELEASES)
@pytest.mark.parametrize("backend", ["fsdp", "megatron"])
def test_old_releases_refused(real_tree, version: str, backend: str) -> None:
    root = real_tree(version)
    original = snapshot(root)
    code, out = cli_json("apply", "--verl-root", root, "--backend", backend, "--worker-impl", "engine")
    assert code == ExitCode.REFUSED
    assert "nothing was written" in out["message"]
    assert any(f"unsupported release: verl {version} has no" in d for d in out["details"])
    assert snapshot(root) == original
    assert not (root / ".rlprobe-patch").exists()
    # --force relaxes the version range only: the anchors are still missing, so still refused.
    code, out = cli_json("apply", "--verl-root", root, "--backend", backend, "--worker-impl", "engine", "--force")
    assert code == ExitCode.REFUSED
    assert any("missing" in d for d in out["details"])
    assert snapshot(root) == original


@pytest.mark.parametrize("version", ["0.6.1", "0.7.1"])
def test_legacy_worker_notice(real_tree, version: str) -> None:
    """Users on 0.6.x / 0.7.x are told the patched engine may not run their PPO actor."""
    root = real_tree(version)
    code, out = cli_json("apply", "--verl-root", root, "--backend", "megatron", "--worker-impl", "engine", "--dry-run")
    assert code == ExitCode.OK
    notices = " ".join(n for p in out["patches"] for n in p["notices"])
    assert "legacy" in notices
    if version.startswith("0.7"):
        assert "trainer.use_legacy_worker_impl=disable" in notices
    assert "+++ b/verl/workers/engine/megatron/transformer_impl.py" in out["diff"]
    assert not (root / ".rlprobe-patch").exists()


def test_loop_overriding_engines_are_named(real_tree) -> None:
    root = real_tree("0.9.1")
    _, out = cli_json("apply", "--verl-root", root, "--backend", "fsdp", "--dry-run")
    notices = " ".join(n for p in out["patches"] for n in p["notices"])
    for engine in ("VeOmniEngine", "TorchTitanEngine", "AutomodelEngine"):
        assert engine in notices
    assert "MegatronEngine" not in notices  # the Megatron backend has its own patch


CONSISTENCY_SET = {
    "verl.prompts-only",
    "verl.debug-metrics",
    "verl.rollout-correction",
    "verl.request-id",
    "verl.logprob-capture",
}


def not_for(version: str) -> set[str]:
    """Patches of the consistency set a release cannot take, by design (their `versions`)."""
    return {
        p.id
        for p in select("verl", "fsdp", "consistency")
        if p.id in CONSISTENCY_SET and not p.supports(Version(version))
    }


def test_not_for_is_what_the_releases_lack() -> None:
    """Pinned: the catalogue's ranges say what each early release lacks."""
    assert not_for("0.6.0") == {"verl.rollout-correction", "verl.request-id"}
    assert not_for("0.6.1") == not_for("0.7.0") == {"verl.request-id"}
    assert not_for("0.7.1") == set()


@pytest.mark.parametrize("backend", ["fsdp", "megatron"])
@pytest.mark.parametrize("version", VERL_RELEASES)
def test_consistency_set_cell(real_tree, version: str, backend: str) -> None:
    """apply --mode consistency: every patch the release can take applies, verifies (ours and the
    skill's check-consistency-patch rules), compiles, re-applies as a no-op, reverts byte-identical."""
    root = real_tree(version)
    original = snapshot(root)
    engine = ("--worker-impl", "engine")
    code, out = cli_json("apply", "--verl-root", root, "--backend", backend, "--mode", "consistency", *engine)
    assert code == ExitCode.OK, out
    states = {p["id"]: p["state"] for p in out["patches"]}
    skipped = not_for(version)
    assert {i for i, s in states.items() if s == "not for this release"} == skipped
    assert {i for i, s in states.items() if s == "applicable"} == (CONSISTENCY_SET - skipped) | {
        f"verl.{'megatron' if backend == 'megatron' else 'fsdp'}-engine"
    }
    for path in out["files"]:
        py_compile.compile(str(root / path), doraise=True, cfile=str(root.parent / "compiled.pyc"))
    assert not any("use_v1" in w for p in out["patches"] for w in p["warnings"])  # V1 is patched where it exists
    prompts_only = next(p for p in out["patches"] if p["id"] == "verl.prompts-only")
    assert ("verl/trainer/ppo/v1/trainer_base.py" in prompts_only["targets"]) is version.startswith("0.9")

    code, out = cli_json("verify", "--verl-root", root)
    assert code == ExitCode.OK, [c for t in out["trees"] for c in t["checks"] if not c["ok"]]
    skill = out["trees"][0]["skill"]
    assert f"PASS: {root / 'verl/utils/debug/metrics.py'}" in skill
    if "verl.request-id" not in skipped:
        assert any(line.endswith("(request_id)") and line.startswith("PASS") for line in skill)
    result = cli(
        "check-consistency-patch", "--verl-root", root, "--backend", "megatron" if backend == "megatron" else "fsdp"
    )
    assert result.exit_code == (1 if skipped else 0), result.stdout

    patched = snapshot(root)
    code, out = cli_json("apply", "--verl-root", root, "--backend", backend, "--mode", "consistency", *engine)
    assert code == ExitCode.OK and out["status"] == "already applied"
    assert snapshot(root) == patched
    assert cli_json("revert", "--verl-root", root)[0] == ExitCode.OK
    assert snapshot(root) == original


def test_request_id_named_explicitly_on_a_release_without_extra_fields(real_tree) -> None:
    root = real_tree("0.7.0")
    code, out = cli_json("apply", "--verl-root", root, "--backend", "fsdp", "--only", "verl.request-id")
    assert code == ExitCode.REFUSED
    assert "no TokenOutput.extra_fields" in " ".join(out["details"])
    assert not (root / ".rlprobe-patch").exists()
