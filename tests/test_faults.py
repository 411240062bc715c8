"""Faults around the write phase: a full disk, two concurrent applies, kills across two trees.

- A full disk: `RLPROBE_PATCH_FAULT=enospc-at=N` fails the N-th write checkpoint with
  OSError(ENOSPC). For every checkpoint of apply and of revert: exit 7 with the reason and
  no traceback, each file original or patched, and the next command leaves a consistent tree.
- Two applies on one tree, as real processes: serialised by the lock (the second re-plans and
  says "already applied", or applies its own patch after the first), or refused with exit 6
  when it will not wait; never interleaved (the tree and the ledger agree).
- kill -9 during `apply --mode consistency` across a verl and a vLLM-Ascend tree (real
  wheels): each tree's files are original or fully patched, and the next command (`revert`)
  finishes the interrupted write and restores every file byte for byte.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import FIXTURES, VLLM_ASCEND_MEMBERS, cli, cli_json, package_wheel, snapshot, unpack, verl_wheel

from rlprobe_patch import fsio
from rlprobe_patch.errors import ExitCode
from rlprobe_patch.fsio import sha256

MEGATRON = "verl/workers/engine/megatron/transformer_impl.py"
FSDP = "verl/workers/engine/fsdp/transformer_impl.py"


def rlprobe(*args: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "rlprobe_patch", *map(str, args)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def records(root: Path) -> list[dict]:
    path = root / ".rlprobe-patch/ledger.json"
    return json.loads(path.read_text())["records"] if path.is_file() else []


# -- a full disk ------------------------------------------------------------------------------
def fail_at(monkeypatch: pytest.MonkeyPatch, k: int) -> None:
    monkeypatch.setenv("RLPROBE_PATCH_FAULT", f"enospc-at={k}")
    monkeypatch.setattr(fsio, "_checkpoints_passed", 0)


def fresh(path: Path) -> Path:
    shutil.copytree(FIXTURES / "verl-0.9", path)
    return path


def test_full_disk_at_every_apply_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reference = fresh(tmp_path / "reference")
    assert cli_json("apply", "--verl-root", reference, "--backend", "megatron")[0] == ExitCode.OK
    patched = sha256((reference / MEGATRON).read_bytes())
    outcomes = []
    for k in range(1, 10):  # apply passes 9 checkpoints on this tree (RLPROBE_PATCH_FAULT=list)
        root = fresh(tmp_path / f"a{k}")
        original = snapshot(root)
        fail_at(monkeypatch, k)
        result = cli("apply", "--verl-root", root, "--backend", "megatron")
        monkeypatch.delenv("RLPROBE_PATCH_FAULT")
        assert result.exit_code == ExitCode.WRITE_FAILED, (k, result.output)
        assert "stopped: No space left on device" in result.stderr and "Traceback" not in result.stderr
        assert sha256((root / MEGATRON).read_bytes()) in {original[MEGATRON][0], patched}
        journal = (root / ".rlprobe-patch/journal.json").exists()
        assert ("records the rest" in result.stderr) == journal
        assert ("nothing in the tree was changed" in result.stderr) == (not journal)
        code, out = cli_json("status", "--verl-root", root, "--backend", "megatron")  # the next command
        assert code == ExitCode.OK and not (root / ".rlprobe-patch/journal.json").exists()
        state = {p["id"]: p["state"] for p in out["trees"][0]["patches"]}["verl.megatron-engine"]
        if journal:
            assert out["trees"][0]["recovered"] and state == "applied" and len(records(root)) == 1
            assert sha256((root / MEGATRON).read_bytes()) == patched
            assert cli_json("verify", "--verl-root", root)[0] == ExitCode.OK
            assert cli_json("revert", "--verl-root", root)[0] == ExitCode.OK
        else:
            assert state == "applicable" and records(root) == []
        assert snapshot(root) == original
        outcomes.append("completed" if journal else "untouched")
    assert outcomes[:3] == ["untouched"] * 3 and set(outcomes[3:]) == {"completed"}  # journal in place from 4


def test_full_disk_at_every_revert_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k in range(1, 9):  # revert passes 8 checkpoints
        root = fresh(tmp_path / f"r{k}")
        original = snapshot(root)
        assert cli_json("apply", "--verl-root", root, "--backend", "fsdp")[0] == ExitCode.OK
        patched = snapshot(root)
        fail_at(monkeypatch, k)
        code, out = cli_json("revert", "--verl-root", root)
        monkeypatch.delenv("RLPROBE_PATCH_FAULT")
        assert code == ExitCode.WRITE_FAILED, (k, out)
        assert snapshot(root) in (original, patched)  # nothing lost: each file whole
        code, out = cli_json("revert", "--verl-root", root)  # the next command finishes or redoes it
        assert code == ExitCode.OK, out
        assert snapshot(root) == original and records(root) == []


# -- two applies at once ------------------------------------------------------------------------
@pytest.fixture
def env(state_home: Path) -> dict[str, str]:
    return {**os.environ, "RLPROBE_PATCH_STATE_HOME": str(state_home), "RLPROBE_PATCH_FAULT": "delay=0.15"}


def test_two_concurrent_applies_of_one_patch_are_serialised(fixture_tree, env: dict) -> None:
    root = fixture_tree("0.9")
    original = snapshot(root)
    args = ("apply", "--verl-root", root, "--backend", "fsdp", "--lock-timeout", "60", "--json")
    procs = [rlprobe(*args, env=env) for _ in range(2)]
    outs = [json.loads(p.communicate()[0]) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert sorted(o["status"] for o in outs) == ["already applied", "applied"]
    assert len(records(root)) == 1  # one record, not two interleaved ones
    assert cli_json("verify", "--verl-root", root)[0] == ExitCode.OK
    assert (root / FSDP).read_text().count("def _ensure_debugger") == 1
    assert cli_json("revert", "--verl-root", root)[0] == ExitCode.OK
    assert snapshot(root) == original


def test_two_concurrent_applies_of_two_patches_both_land(fixture_tree, env: dict) -> None:
    root = fixture_tree("0.9")
    original = snapshot(root)
    procs = [
        rlprobe("apply", "--verl-root", root, "--backend", backend, "--lock-timeout", "60", "--json", env=env)
        for backend in ("fsdp", "megatron")
    ]
    outs = [json.loads(p.communicate()[0]) for p in procs]
    assert [p.returncode for p in procs] == [0, 0] and [o["status"] for o in outs] == ["applied", "applied"]
    assert sorted(f["path"] for r in records(root) for f in r["files"]) == [FSDP, MEGATRON]
    out = cli_json("status", "--verl-root", root)[1]
    states = {p["id"]: p["state"] for p in out["trees"][0]["patches"]}
    assert states["verl.fsdp-engine"] == states["verl.megatron-engine"] == "applied"
    assert cli_json("verify", "--verl-root", root)[0] == ExitCode.OK
    assert cli_json("revert", "--verl-root", root)[0] == ExitCode.OK
    assert snapshot(root) == original


def test_second_apply_that_will_not_wait_is_refused(fixture_tree, env: dict) -> None:
    root = fixture_tree("0.9")
    slow = {**env, "RLPROBE_PATCH_FAULT": "delay=0.6"}  # its write phase outlasts the second run's start-up
    first = rlprobe("apply", "--verl-root", root, "--backend", "megatron", env=slow)
    assert first.stderr is not None
    for line in first.stderr:  # the first run holds the lock from here until it finishes
        if "writing" in line:
            break
    quick = {k: v for k, v in env.items() if k != "RLPROBE_PATCH_FAULT"}
    second = rlprobe("apply", "--verl-root", root, "--backend", "fsdp", "--lock-timeout", "0", env=quick)
    _, err = second.communicate()
    first.communicate()
    assert second.returncode == ExitCode.LOCKED and first.returncode == 0
    assert f"{root} is locked by another rlprobe-patch run (pid {first.pid})" in err
    assert [f["path"] for r in records(root) for f in r["files"]] == [MEGATRON]  # only the first run's file
    assert "_ensure_debugger" not in (root / FSDP).read_text()


# -- kill -9 across two trees -------------------------------------------------------------------
# Checkpoints of `apply --mode consistency` on verl 0.9.1 + vLLM-Ascend 0.13.0 (RLPROBE_PATCH_FAULT=list):
# verl 1 diff, 2-3 journal, 4-15 six files, 16-17 ledger, 18 registry, 19 journal cleared; vLLM-Ascend
# 20 diff, 21-22 journal, 23-26 the new module and the runner, 27-28 ledger, 29 registry, 30 cleared.
KILL_POINTS = (3, 13, 19, 22, 26)  # journal written, mid-files, journal not yet cleared; mid-second tree


@pytest.mark.real
def test_kill_during_consistency_apply_across_two_trees(tmp_path: Path, state_home: Path) -> None:
    def trees(name: str) -> tuple[Path, Path]:
        verl = tmp_path / name / "verl"
        with zipfile.ZipFile(verl_wheel("0.9.1")) as zf:
            zf.extractall(verl)
        return verl, unpack(package_wheel("vllm-ascend", "0.13.0"), tmp_path / name / "va", VLLM_ASCEND_MEMBERS)

    def apply(verl: Path, va: Path, fault: str) -> subprocess.Popen:
        env = {**os.environ, "RLPROBE_PATCH_STATE_HOME": str(state_home / verl.parent.name)}
        env["RLPROBE_PATCH_FAULT"] = fault
        args = ("apply", "--verl-root", verl, "--vllm-ascend-root", va, "--backend", "fsdp")
        return rlprobe(*args, "--mode", "consistency", "--worker-impl", "engine", env=env)

    ref_verl, ref_va = trees("reference")
    original = {"verl": snapshot(ref_verl), "va": snapshot(ref_va)}
    listing = apply(ref_verl, ref_va, "list")
    assert listing.communicate()[0].count("checkpoint") == 30 and listing.returncode == 0
    patched = {"verl": snapshot(ref_verl), "va": snapshot(ref_va)}

    runs = []
    for k in KILL_POINTS:
        verl, va = trees(f"k{k}")
        runs.append((k, verl, va, apply(verl, va, f"kill-at={k}")))
        if len(runs) == 2 or k == KILL_POINTS[-1]:  # two at a time: two cores
            for k_, verl_, va_, proc in runs:
                proc.communicate()
                assert proc.returncode == -signal.SIGKILL, k_
                check_after_kill(k_, {"verl": verl_, "va": va_}, original, patched)
            runs = []


def check_after_kill(k: int, roots: dict[str, Path], original: dict, patched: dict) -> None:
    for name, root in roots.items():
        # A killed atomic write leaves its temp file (removed by the next command), never a partial target.
        now = {p: v for p, v in snapshot(root).items() if not p.endswith(".rlprobe-tmp")}
        # Every file whole: the original bytes or the patched bytes, never a mix inside a file.
        assert all(now.get(p) in (original[name].get(p), patched[name].get(p)) for p in {*now, *patched[name]}), k
    journals = {name: (root / ".rlprobe-patch/journal.json").exists() for name, root in roots.items()}
    for name, root in roots.items():
        state = root / ".rlprobe-patch"
        code, out = cli_json("revert", "--verl-root" if name == "verl" else "--vllm-ascend-root", root)
        if not journals[name] and not (state / "ledger.json").exists():  # killed before its journal
            assert code == ExitCode.REFUSED and "nothing recorded" in out["message"], (k, out)
        else:
            assert code == ExitCode.OK, (k, out)
            assert bool(out["trees"][0]["recovered"]) == journals[name], (k, name)
        assert snapshot(root) == original[name], (k, name)
        assert records(root) == [] and not (root / ".rlprobe-patch/journal.json").exists()
