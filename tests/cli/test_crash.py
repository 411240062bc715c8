"""Crash injection: kill -9 during apply's (and revert's) write phase, then the next command.

After every kill the engine file is either the original or the fully patched file, and the
next command (`status`) finishes an interrupted write and leaves a consistent tree: patched
and recorded (verify passes, revert restores the original bytes), or original and unrecorded.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import FIXTURES, cli_json, snapshot

from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.base.fsio import sha256

TARGET = "verl/workers/engine/megatron/transformer_impl.py"
DELAY = 0.03  # seconds slept at each write checkpoint, so that a random kill lands inside the write phase


def rlprobe(*args: str, env: dict[str, str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlprobe_patch", *args], env=env, capture_output=True, text=True, **kw)


@pytest.fixture
def patched_bytes(tmp_path: Path, state_home: Path) -> bytes:
    root = tmp_path / "reference"
    shutil.copytree(FIXTURES / "verl-0.9", root)
    env = {**os.environ, "RLPROBE_PATCH_STATE_HOME": str(state_home / "ref")}
    assert rlprobe("apply", "--verl-root", str(root), "--backend", "megatron", env=env).returncode == 0
    return (root / TARGET).read_bytes()


def check_consistent_after_next_command(root: Path, original: dict, patched: bytes, env: dict) -> str:
    """Runs the next command (in-process, for speed) and checks the law; returns the outcome."""
    data = (root / TARGET).read_bytes()
    assert sha256(data) in {original[TARGET][0], sha256(patched)}, "half-written file"
    saved = os.environ.get("RLPROBE_PATCH_STATE_HOME")
    os.environ["RLPROBE_PATCH_STATE_HOME"] = env["RLPROBE_PATCH_STATE_HOME"]
    try:
        code, out = cli_json("status", "--verl-root", root)
        assert code == ExitCode.OK, out
        assert not (root / ".rlprobe-patch" / "journal.json").exists()
        report = out["trees"][0]
        state = {p["id"]: p["state"] for p in report["patches"]}["verl.megatron-engine"]
        if (root / TARGET).read_bytes() == patched:
            assert state == "applied" and report["records"], report
            code, out = cli_json("verify")  # no arguments: the registry knows the tree
            assert code == ExitCode.OK, out
            assert cli_json("revert", "--verl-root", root)[0] == ExitCode.OK
            assert snapshot(root) == original
            return "patched"
        assert state == "applicable" and not report["records"], report
        assert snapshot(root) == original
        return "original"
    finally:
        os.environ["RLPROBE_PATCH_STATE_HOME"] = saved or ""


def test_kill_at_every_checkpoint(tmp_path: Path, state_home: Path, patched_bytes: bytes) -> None:
    outcomes = []
    for k in range(1, 10):
        root = tmp_path / f"t{k}"
        shutil.copytree(FIXTURES / "verl-0.9", root)
        original = snapshot(root)
        env = {
            **os.environ,
            "RLPROBE_PATCH_STATE_HOME": str(state_home / f"s{k}"),
            "RLPROBE_PATCH_FAULT": f"kill-at={k}",
        }
        proc = rlprobe("apply", "--verl-root", str(root), "--backend", "megatron", env=env)
        env.pop("RLPROBE_PATCH_FAULT")
        if proc.returncode == 0:  # k is past the last checkpoint
            outcomes.append("finished")
            continue
        assert proc.returncode == -signal.SIGKILL
        outcomes.append(check_consistent_after_next_command(root, original, patched_bytes, env))
    # Killed before the journal: original; after it: the next command completes the apply.
    assert outcomes[:3] == ["original", "original", "original"]
    assert set(outcomes[3:]) <= {"patched", "finished"} and "patched" in outcomes


SHARDS = 5  # fifty kills, as five tests of ten: xdist spreads them (one test of fifty held a worker for 80 s)


# The README's test command runs the first shard; the fast legs and the exhaustive leg all five.
@pytest.mark.parametrize("shard", [0, *(pytest.param(s, marks=pytest.mark.exhaustive) for s in range(1, SHARDS))])
def test_fifty_random_kills_during_apply(shard: int, tmp_path: Path, state_home: Path, patched_bytes: bytes) -> None:
    """Kill -9 at a random moment of the write phase; the next command leaves the tree original or patched.
    Trial t of the fifty sleeps at a random point of its own slot of the range, so each shard spans the
    whole write phase."""
    rng = random.Random(20261129 + shard)
    outcomes = {"original": 0, "patched": 0, "finished": 0}
    trials = range(shard, 50, SHARDS)
    for trial in trials:
        root = tmp_path / f"r{trial}"
        shutil.copytree(FIXTURES / "verl-0.9", root)
        original = snapshot(root)
        env = {**os.environ, "RLPROBE_PATCH_STATE_HOME": str(state_home / f"r{trial}")}
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlprobe_patch", "apply", "--verl-root", str(root), "--backend", "megatron"],
            env={**env, "RLPROBE_PATCH_FAULT": f"delay={DELAY}"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stderr is not None
        for line in proc.stderr:  # the write phase starts with this progress line
            if "writing" in line:
                break
        time.sleep((trial + rng.random()) / 50 * 12 * DELAY)
        proc.send_signal(signal.SIGKILL)
        code = proc.wait()
        if code == 0:
            outcomes["finished"] += 1
            continue
        outcomes[check_consistent_after_next_command(root, original, patched_bytes, env)] += 1
    assert sum(outcomes.values()) == len(trials)
    assert outcomes["original"] > 0 and outcomes["patched"] > 0, outcomes  # kills landed on both sides


def test_kill_during_revert(tmp_path: Path, state_home: Path, patched_bytes: bytes) -> None:
    for k in range(1, 9):
        root = tmp_path / f"v{k}"
        shutil.copytree(FIXTURES / "verl-0.9", root)
        original = snapshot(root)
        env = {**os.environ, "RLPROBE_PATCH_STATE_HOME": str(state_home / f"v{k}")}
        assert rlprobe("apply", "--verl-root", str(root), "--backend", "megatron", env=env).returncode == 0
        proc = rlprobe("revert", "--verl-root", str(root), env={**env, "RLPROBE_PATCH_FAULT": f"kill-at={k}"})
        if proc.returncode == 0:
            assert snapshot(root) == original
            continue
        assert proc.returncode == -signal.SIGKILL
        assert check_consistent_after_next_command(root, original, patched_bytes, env) in {"original", "patched"}
