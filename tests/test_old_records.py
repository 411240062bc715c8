"""Trees patched by an earlier release of rlprobe-patch still read as applied, verify clean,
re-apply as a no-op and revert byte for byte (records kept as test data, tests/data/README.md)."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest
from conftest import FIXTURES, cli, cli_json, snapshot

from rlprobe_patch.errors import ExitCode

DATA = Path(__file__).parent / "data"
TREES = [f"verl-{family}-{backend}" for family in ("0.6", "0.8", "0.9") for backend in ("fsdp", "megatron")]


@pytest.fixture
def old_tree(tmp_path: Path):
    def make(name: str) -> Path:
        with tarfile.open(DATA / "records-0.1.0.tar.gz") as archive:
            members = [m for m in archive.getmembers() if m.name == name or m.name.startswith(f"{name}/")]
            archive.extractall(tmp_path, members=members, filter="tar")
        return tmp_path / name

    return make


@pytest.mark.parametrize("name", TREES)
def test_tree_patched_by_0_1_0(old_tree, name: str) -> None:
    root = old_tree(name)
    family, backend = name.split("-")[1:]
    engine = f"verl.{'fsdp' if backend == 'fsdp' else 'megatron'}-engine"
    code, out = cli_json("status", "--verl-root", root)
    assert code == ExitCode.OK, out
    states = {p["id"]: p["state"] for t in out["trees"] for p in t["patches"]}
    assert states[engine] == "applied", states
    code, out = cli_json("verify", "--verl-root", root)
    assert code == ExitCode.OK, out
    ledger = (root / ".rlprobe-patch" / "ledger.json").read_bytes()
    extra = ["--worker-impl", "engine"] if family == "0.6" else []
    result = cli("apply", "--verl-root", root, "--backend", backend, *extra)
    assert result.exit_code == ExitCode.OK and "already applied" in result.stdout, result.stdout
    assert (root / ".rlprobe-patch" / "ledger.json").read_bytes() == ledger
    code, out = cli_json("revert", "--verl-root", root)
    assert code == ExitCode.OK, out
    assert snapshot(root) == snapshot(FIXTURES / f"verl-{family}")
