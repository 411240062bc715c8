"""Faults around the write phase: a full disk, two concurrent applies, kills across two trees.

- A full disk: `RLPROBE_PATCH_FAULT=enospc-at=N` fails the N-th write checkpoint with
  OSError(ENOSPC). For every checkpoint of apply and of revert: exit 7 with the reason and
  no traceback, each file original or patched, and the next command leaves a consistent tree.
- Two applies on one tree, as real processes: serialised by the lock (the second re-plans and
  says "already applied", or applies its own patch after the first), or refused with exit 6
  when it will not wait; never interleaved (the tree and the ledger agree).
(kill -9 at every write step across two trees: tests/real/test_crash_two_trees.py.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import FIXTURES, cli, cli_json, snapshot

from rlprobe_patch.base import fsio
from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.base.fsio import sha256

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


# -- a real full disk -------------------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs (mounting needs root; without it the injected ENOSPC tests above stand in)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], capture_output=True)
        why = mounted.stderr.decode().strip() if mounted.returncode else ""
    except FileNotFoundError:
        why = "no mount command"
    if why:
        pytest.skip(f"cannot mount a tmpfs here ({why}); ENOSPC is injected above")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "--lazy", str(disk)], check=True)  # lazy: a finished child may hold it briefly


def fill(disk: Path, leave: int) -> None:
    """Take all the free space of `disk` but `leave` bytes."""
    stat = os.statvfs(disk)
    size = stat.f_bavail * stat.f_frsize - leave
    if size > 0:
        with open(disk / "filler", "wb") as f:
            f.truncate(0)
            f.write(b"\0" * size)


def test_a_real_full_disk_during_apply_and_revert(small_disk: Path, tmp_path: Path) -> None:
    """The tree on a tmpfs filled up to `free` bytes, for `free` from 0 up to enough, 4 KiB apart:
    apply and revert succeed or stop with exit 7, every file whole, and once space is freed the
    next command leaves a consistent tree."""
    reference = fresh(tmp_path / "reference")
    assert cli_json("apply", "--verl-root", reference, "--backend", "megatron")[0] == ExitCode.OK
    whole = {sha256((FIXTURES / "verl-0.9" / MEGATRON).read_bytes()), sha256((reference / MEGATRON).read_bytes())}
    outcomes = []
    for free in range(0, 200 * 1024, 4096):
        root = small_disk / "tree"
        shutil.rmtree(root, ignore_errors=True)
        (small_disk / "filler").unlink(missing_ok=True)
        shutil.copytree(FIXTURES / "verl-0.9", root)
        original = snapshot(root)
        fill(small_disk, free)
        result = cli("apply", "--verl-root", root, "--backend", "megatron")
        (small_disk / "filler").unlink()
        assert result.exit_code in (ExitCode.OK, ExitCode.WRITE_FAILED), (free, result.output)
        assert "Traceback" not in result.stderr and "internal error" not in result.stderr, (free, result.stderr)
        assert sha256((root / MEGATRON).read_bytes()) in whole, free
        journal = (root / ".rlprobe-patch/journal.json").exists()
        outcomes.append("applied" if result.exit_code == 0 else "pending" if journal else "nothing written")
        code, out = cli_json("status", "--verl-root", root)  # the next command, with space again
        assert code == ExitCode.OK, (free, out)
        state = {p["id"]: p["state"] for p in out["trees"][0]["patches"]}["verl.megatron-engine"]
        if state == "applicable":
            assert outcomes[-1] == "nothing written" and records(root) == [] and snapshot(root) == original
            continue
        assert state == "applied" and len(records(root)) == 1, (free, out)
        assert cli_json("verify", "--verl-root", root)[0] == ExitCode.OK
        patched = snapshot(root)
        fill(small_disk, free)  # revert on the full disk as well
        code, out = cli_json("revert", "--verl-root", root)
        (small_disk / "filler").unlink()
        assert code in (ExitCode.OK, ExitCode.WRITE_FAILED), (free, out)
        assert snapshot(root) in (original, patched) or (root / ".rlprobe-patch/journal.json").exists()
        code, out = cli_json("revert", "--verl-root", root)
        assert code in (ExitCode.OK, ExitCode.REFUSED), (free, out)  # REFUSED: the first revert finished it
        assert snapshot(root) == original and records(root) == [], free
    assert {"nothing written", "pending", "applied"} <= set(outcomes), outcomes
