"""Trees patched by an earlier release of rlprobe-patch (records kept as test data,
tests/data/README.md) under today's catalogue: where the patch's revision is unchanged they read
as applied, verify clean and re-apply as a no-op; where it is newer they read as outdated
(`applied r1, current r2`), verify clean with a warning, and `apply` upgrades them in one record.
Either way a second apply writes nothing and revert gives back the original bytes."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
from conftest import FIXTURES, TESTS, cli, cli_json, snapshot

from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.catalogue.patches import get_patch

DATA = TESTS / "data"
TREES = [f"verl-{family}-{backend}" for family in ("0.6", "0.8", "0.9") for backend in ("fsdp", "megatron")]


@pytest.fixture
def old_tree(tmp_path: Path):
    def make(name: str) -> Path:
        with tarfile.open(DATA / "records-0.1.0.tar.gz") as archive:
            members = [m for m in archive.getmembers() if m.name == name or m.name.startswith(f"{name}/")]
            archive.extractall(tmp_path, members=members, filter="tar")
        return tmp_path / name

    return make


def ledger(root: Path) -> dict:
    return json.loads((root / ".rlprobe-patch" / "ledger.json").read_text())


@pytest.mark.parametrize("name", TREES)
def test_tree_patched_by_0_1_0(old_tree, name: str) -> None:
    root = old_tree(name)
    family, backend = name.split("-")[1:]
    engine = f"verl.{backend}-engine"
    (recorded,) = [p["revision"] for r in ledger(root)["records"] for p in r["patches"] if p["id"] == engine]
    current = get_patch(engine).revision
    code, out = cli_json("status", "--verl-root", root)
    assert code == ExitCode.OK, out
    patch = {p["id"]: p for t in out["trees"] for p in t["patches"]}[engine]
    if recorded == current:
        assert patch["state"] == "applied", patch
    else:
        assert (patch["state"], patch["recorded_revision"]) == ("outdated", recorded), patch
    code, out = cli_json("verify", "--verl-root", root)
    assert code == ExitCode.OK, out
    extra = ["--worker-impl", "engine"] if family == "0.6" else []
    code, out = cli_json("apply", "--verl-root", root, "--backend", backend, *extra)
    assert code == ExitCode.OK, out
    assert out.get("upgraded", []) == ([] if recorded == current else [{"id": engine, "from": recorded, "to": current}])
    assert [[(p["id"], p["revision"]) for p in r["patches"]] for r in ledger(root)["records"]] == [[(engine, current)]]
    code, out = cli_json("verify", "--verl-root", root)
    assert code == ExitCode.OK, out
    before = (root / ".rlprobe-patch" / "ledger.json").read_bytes()
    again = cli("apply", "--verl-root", root, "--backend", backend, *extra)
    assert again.exit_code == ExitCode.OK and "already applied" in again.stdout, again.stdout
    assert (root / ".rlprobe-patch" / "ledger.json").read_bytes() == before
    code, out = cli_json("revert", "--verl-root", root)
    assert code == ExitCode.OK, out
    assert snapshot(root) == snapshot(FIXTURES / f"verl-{family}")
