"""kill -9 across two trees: a verl and a vLLM-Ascend tree patched and reverted together.

`apply --mode consistency` on real verl 0.9.1 + vLLM-Ascend 0.13.0 writes eight files, a new
module among them, through 30 write checkpoints (diff, journal, files, ledger, registry,
journal cleared; per tree); `revert` of both passes 27. The tests kill the process at every
one of them, at random points of apply's write phase, and at every checkpoint of the revert.

After each kill:
- every file of both trees is whole: its original or its patched bytes, never a mix;
- a tree without a pending journal is exactly original or exactly patched (and recorded so);
- the next command, whichever it is, completes the interrupted write and does its own job:
  `apply` leaves both trees patched (verify passes), `revert` leaves both byte-identical to
  the originals, modes included, with nothing recorded.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from conftest import VLLM_ASCEND_MEMBERS, cli_json, package_wheel, snapshot, unpack, verl_wheel

from rlprobe_patch.base.errors import ExitCode

# The exhaustive leg's (`-m exhaustive`, .ci/run): too long for the README's test command (issue 35).
pytestmark = pytest.mark.exhaustive

APPLY = ("apply", "--backend", "fsdp", "--mode", "consistency", "--worker-impl", "engine")
APPLY_CHECKPOINTS = 34
REVERT_CHECKPOINTS = 31
SHARDS = 3  # each test's kill points are spread over shards, so that xdist workers share them
DELAY = 0.02  # seconds slept at every checkpoint in the random-kill test


class Pair:
    """One scratch copy of the two trees."""

    def __init__(self, pristine: Path, dest: Path) -> None:
        shutil.copytree(pristine, dest)
        self.roots = {"verl": dest / "verl", "va": dest / "va"}

    @property
    def args(self) -> tuple[str, ...]:
        return ("--verl-root", str(self.roots["verl"]), "--vllm-ascend-root", str(self.roots["va"]))

    def snapshot(self) -> dict[str, dict]:
        return {name: snapshot(root) for name, root in self.roots.items()}

    def journals(self) -> dict[str, bool]:
        return {name: (root / ".rlprobe-patch/journal.json").exists() for name, root in self.roots.items()}

    def records(self, name: str) -> list[dict]:
        ledger = self.roots[name] / ".rlprobe-patch/ledger.json"
        return json.loads(ledger.read_text())["records"] if ledger.is_file() else []

    def start(self, *args: str, fault: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "rlprobe_patch", *args, *self.args],
            env={**os.environ, "RLPROBE_PATCH_FAULT": fault},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, dict]:
    """The pristine pair (unpacked once), and the snapshots of both trees original and patched."""
    pristine = tmp_path_factory.mktemp("pristine")
    with zipfile.ZipFile(verl_wheel("0.9.1")) as zf:
        zf.extractall(pristine / "verl")
    unpack(package_wheel("vllm-ascend", "0.13.0"), pristine / "va", VLLM_ASCEND_MEMBERS)
    pair = Pair(pristine, tmp_path_factory.mktemp("reference") / "pair")
    original = pair.snapshot()
    home = os.environ.get("RLPROBE_PATCH_STATE_HOME")
    os.environ["RLPROBE_PATCH_STATE_HOME"] = str(tmp_path_factory.mktemp("reference-state"))
    try:
        first = pair.start(*APPLY, fault="")
        assert first.communicate()[1] is not None and first.returncode == 0
    finally:
        if home is None:
            os.environ.pop("RLPROBE_PATCH_STATE_HOME")
        else:
            os.environ["RLPROBE_PATCH_STATE_HOME"] = home
    patched = pair.snapshot()
    assert all(original[name] != patched[name] for name in pair.roots)  # both trees take patches
    assert "vllm_ascend/worker/dispatch_logger.py" in set(patched["va"]) - set(original["va"])  # a new file
    return pristine, original, patched


def test_checkpoint_counts(tmp_path: Path, reference: tuple[Path, dict, dict]) -> None:
    """The kill points below cover every write step: the listing has exactly this many."""
    pair = Pair(reference[0], tmp_path / "pair")

    def listed(*args: str) -> list[str]:
        proc = subprocess.run(
            [sys.executable, "-m", "rlprobe_patch", *args, *pair.args],
            env={**os.environ, "RLPROBE_PATCH_FAULT": "list"},
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stderr
        return [line for line in proc.stdout.splitlines() if line.startswith("checkpoint ")]

    apply_steps, revert_steps = listed(*APPLY), listed("revert")
    assert len(apply_steps) == APPLY_CHECKPOINTS and len(revert_steps) == REVERT_CHECKPOINTS
    # Both trees' files are among them, each written through a temp file and a rename: eight verl
    # files, the new vLLM-Ascend module and the vLLM-Ascend model runner.
    assert sum(": rename " in step and step.endswith(".py") for step in apply_steps) == 10


def check_whole(pair: Pair, original: dict, patched: dict, what: str) -> None:
    """Right after a kill: every file whole; a tree without a journal original or patched."""
    now = pair.snapshot()
    journals = pair.journals()
    for name in pair.roots:
        # A killed atomic write leaves its temp file (the next command removes it), never a partial target.
        files = {p: v for p, v in now[name].items() if not p.endswith(".rlprobe-tmp")}
        for path in {*files, *patched[name]}:
            assert files.get(path) in (original[name].get(path), patched[name].get(path)), (what, name, path)
        if not journals[name]:
            assert files in (original[name], patched[name]), (what, name, "a tree without a journal is mixed")
            assert bool(pair.records(name)) == (files == patched[name]), (what, name, "ledger disagrees")


def next_command(pair: Pair, command: str, original: dict, patched: dict, what: str) -> None:
    """The next command after a kill completes what was interrupted, then does its own job."""
    journals = pair.journals()
    if command == "apply":
        code, out = cli_json(*APPLY, *pair.args)
        assert code == ExitCode.OK, (what, out)
        assert pair.snapshot() == patched, what
        code, verified = cli_json("verify", *pair.args)
        assert code == ExitCode.OK, (what, verified)
    else:
        recorded = any((root / ".rlprobe-patch/ledger.json").exists() for root in pair.roots.values())
        code, out = cli_json("revert", *pair.args)
        if not recorded and not any(journals.values()):  # killed before anything was recorded: it says so
            assert code == ExitCode.REFUSED and "nothing recorded" in out["message"], (what, out)
            assert pair.snapshot() == original, what
            return
        assert code == ExitCode.OK, (what, out)
        assert pair.snapshot() == original, what
        assert pair.records("verl") == [] and pair.records("va") == []
    recovered = {Path(t.get("root") or t["tree"]["root"]): bool(t["recovered"]) for t in out["trees"]}  # revert | apply
    for name, root in pair.roots.items():
        if root in recovered:
            assert recovered[root] == journals[name], (what, name)
        else:
            assert not journals[name], (what, name)
    assert not any(pair.journals().values())


def kill_at(pair: Pair, args: tuple[str, ...], k: int) -> None:
    proc = pair.start(*args, fault=f"kill-at={k}")
    _, err = proc.communicate()
    assert proc.returncode == -signal.SIGKILL, (k, err)


@pytest.mark.parametrize("shard", range(SHARDS))
def test_kill_at_every_apply_checkpoint(shard: int, tmp_path: Path, reference: tuple[Path, dict, dict]) -> None:
    pristine, original, patched = reference
    for k in range(1 + shard, APPLY_CHECKPOINTS + 1, SHARDS):
        pair = Pair(pristine, tmp_path / f"k{k}")
        kill_at(pair, APPLY, k)
        check_whole(pair, original, patched, f"apply killed at {k}")
        # Half of the kills are followed by apply again, half by revert.
        next_command(pair, "apply" if k % 2 else "revert", original, patched, f"apply killed at {k}")


@pytest.mark.parametrize("shard", range(SHARDS))
def test_kill_at_every_revert_checkpoint(shard: int, tmp_path: Path, reference: tuple[Path, dict, dict]) -> None:
    pristine, original, patched = reference
    for k in range(1 + shard, REVERT_CHECKPOINTS + 1, SHARDS):
        pair = Pair(pristine, tmp_path / f"k{k}")
        assert cli_json(*APPLY, *pair.args)[0] == ExitCode.OK
        kill_at(pair, ("revert",), k)
        check_whole(pair, original, patched, f"revert killed at {k}")
        next_command(pair, "revert" if k % 2 else "apply", original, patched, f"revert killed at {k}")


@pytest.mark.parametrize("shard", range(2))
def test_random_kills_during_two_tree_apply(shard: int, tmp_path: Path, reference: tuple[Path, dict, dict]) -> None:
    pristine, original, patched = reference
    rng = random.Random(20261129 + shard)
    where = []
    for trial in range(8):
        pair = Pair(pristine, tmp_path / f"r{trial}")
        proc = pair.start(*APPLY, fault=f"delay={DELAY}")
        assert proc.stderr is not None
        for line in proc.stderr:  # the first tree's write phase starts with this progress line
            if "writing" in line:
                break
        time.sleep(rng.uniform(0, (APPLY_CHECKPOINTS + 2) * DELAY))
        proc.kill()
        proc.communicate()
        what = f"random kill {shard}/{trial}"
        if proc.returncode == 0:  # it finished first
            where.append("finished")
            assert pair.snapshot() == patched
            continue
        assert proc.returncode == -signal.SIGKILL
        check_whole(pair, original, patched, what)
        now = pair.snapshot()
        where.append(
            "verl pending"
            if pair.journals()["verl"]
            else "verl done, vLLM-Ascend pending"
            if pair.journals()["va"]
            else "verl done"
            if now["verl"] == patched["verl"] and now["va"] == original["va"]
            else "both done"
        )
        next_command(pair, "apply" if trial % 2 else "revert", original, patched, what)
    assert len(set(where)) >= 2, where  # the kills landed at different stages
