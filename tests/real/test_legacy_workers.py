"""The legacy-worker patches (`verl.legacy-fsdp-workers`, `verl.legacy-megatron-workers`).

On verl 0.6.x, and on 0.7.x unless `trainer.use_legacy_worker_impl=disable`, the PPO actor runs
through `fsdp_workers.py` + `actor/dp_actor.py` or `megatron_workers.py` + `actor/megatron_actor.py`,
not through the engine. These tests prove the real-release matrix (0.6.0, 0.6.1, 0.7.0, 0.7.1 x
both patches, on the real wheels): apply, our verify checks, py_compile, a no-op second apply, a
byte-identical revert; 0.8.0 (legacy workers removed) refused, with and without `--force`.
That the inserted code runs: tests/runtime/test_legacy_workers_runtime.py.
"""

from __future__ import annotations

import py_compile

import pytest
import unidiff
from conftest import LEGACY_PATCHES, cli_json, snapshot

from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.catalogue.patches import load_catalogue

LEGACY_RELEASES = ("0.6.0", "0.6.1", "0.7.0", "0.7.1")


# -- the real-release matrix ------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["fsdp", "megatron"])
@pytest.mark.parametrize("version", LEGACY_RELEASES)
def test_legacy_patch_cell(real_tree, version: str, backend: str) -> None:
    patch_id, rel = LEGACY_PATCHES[backend]
    root = real_tree(version)
    original = snapshot(root)
    target = root / rel
    target.chmod(0o640)  # an unusual mode must survive apply and revert
    original[rel] = (original[rel][0], 0o640)

    code, out = cli_json("apply", "--verl-root", root, "--backend", backend, "--only", patch_id)
    assert code == ExitCode.OK, out
    assert out["status"] == "applied" and out["tree"]["version"] == version
    assert out["files"] == [rel]
    assert target.stat().st_mode & 0o7777 == 0o640
    py_compile.compile(str(target), doraise=True, cfile=str(root.parent / "compiled.pyc"))
    notices = " ".join(n for p in out["patches"] for n in p["notices"])
    if version.startswith("0.7"):
        assert "trainer.use_legacy_worker_impl" in notices

    diff_text = (root / ".rlprobe-patch" / out["diff_file"].split(".rlprobe-patch/")[1]).read_text()
    revision = next(p.revision for p in load_catalogue() if p.id == patch_id)
    assert f"# Patches: {patch_id} r{revision}" in diff_text
    diff = unidiff.PatchSet(diff_text)
    assert [f.path for f in diff] == [rel]
    assert diff[0].removed == 0 and diff[0].added > 40
    added = "".join(str(line) for hunk in diff[0] for line in hunk if line.is_added)
    # One start and one finish per micro-batch site: two loops (FSDP) or forward_step/loss_func (Megatron).
    if backend == "fsdp":
        assert added.count("self._debugger.start(model=self.actor_module)") == 2
        assert added.count("self._finish_dump_step(micro_batch)") == 2
    else:
        assert added.count("self._start_dump_step(model, batch)") == 1
        assert added.count("self._dump_after_loss(") == 2
        # guards: after both forward_backward_func calls, in forward_step, before both loss_func returns
        assert added.count("if self._dump_should_record:  # rlprobe-patch") == 5

    # Our own checks (hooks in place, compiles, unchanged since apply, diff reverse-applies) pass.
    # The skill's check-engine-patch looks at the engine file only, which this patch leaves alone.
    code, out = cli_json("verify", "--verl-root", root)
    checks = out["trees"][0]["checks"]
    ours = [c for c in checks if not c["check"].startswith("skill")]
    assert ours and all(c["ok"] for c in ours), [c for c in ours if not c["ok"]]
    names = [c["check"] for c in ours]
    assert f"{patch_id}: hooks in place in {rel}" in names
    assert any(n.startswith("recorded diff reverse-applies") for n in names)

    code, out = cli_json("status", "--verl-root", root)
    assert {p["id"]: p["state"] for p in out["trees"][0]["patches"]}[patch_id] == "applied"

    patched = snapshot(root)
    code, out = cli_json("apply", "--verl-root", root, "--backend", backend, "--only", patch_id)
    assert code == ExitCode.OK and out["status"] == "already applied" and out["files"] == []
    assert snapshot(root) == patched

    code, out = cli_json("revert", "--verl-root", root)
    assert code == ExitCode.OK, out
    assert out["trees"][0]["files"] == [rel]
    assert snapshot(root) == original


@pytest.mark.parametrize("backend", ["fsdp", "megatron"])
def test_legacy_patches_refused_from_0_8_0(real_tree, backend: str) -> None:
    """0.8.0 removed the legacy workers: refused with the reason; --force finds no file to hook."""
    patch_id, rel = LEGACY_PATCHES[backend]
    root = real_tree("0.8.0")
    original = snapshot(root)
    code, out = cli_json("apply", "--verl-root", root, "--backend", backend, "--only", patch_id)
    assert code == ExitCode.REFUSED
    assert "nothing was written" in out["message"]
    assert any("unsupported release: verl 0.8.0 has no legacy" in d and "engine" in d for d in out["details"])
    code, out = cli_json("apply", "--verl-root", root, "--backend", backend, "--only", patch_id, "--force")
    assert code == ExitCode.REFUSED
    assert any(f"{rel}: missing" in d for d in out["details"])
    assert snapshot(root) == original
    assert not (root / ".rlprobe-patch").exists()
