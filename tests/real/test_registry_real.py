"""The registry of patched trees survives trees that are deleted or moved (issue 14, item 5).

Argument-less `status` lists every registered tree and marks the gone ones; `verify` and
`revert` act on the trees that exist and name the gone ones (exit 3 only when every registered
tree is gone); `forget PATH` and `status --prune` drop entries; a tree that comes back at the
same path is found again. (The registry's own folder, issue 13: tests/cli/test_registry.py.)
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import cli, cli_json, registry, snapshot

from rlprobe_patch.base.errors import ExitCode


@pytest.fixture
def two_trees(real_tree) -> tuple[Path, Path, dict]:
    """verl 0.9.1 and 0.8.0, both patched and registered: (kept, deleted later, kept's original snapshot)."""
    kept, other = real_tree("0.9.1"), real_tree("0.8.0")
    original = snapshot(kept)
    for root in (kept, other):
        assert cli_json("apply", "--verl-root", root, "--backend", "fsdp")[0] == ExitCode.OK
    return kept, other, original


def test_a_deleted_tree_does_not_block_the_others(two_trees, state_home: Path) -> None:
    kept, gone, original = two_trees
    shutil.rmtree(gone)
    reason = f"--verl-root {gone}: no such directory"
    code, out = cli_json("status")
    assert code == ExitCode.OK
    assert [t["tree"]["root"] for t in out["trees"]] == [str(kept)]
    assert out["gone"] == [{"root": str(gone), "package": "verl", "reason": reason}]
    text = cli("status").stdout
    assert f"verl at {gone}: gone ({reason})" in text and "rlprobe-patch forget PATH" in text
    code, out = cli_json("verify")
    assert code == ExitCode.OK and out["ok"]
    assert [t["tree"]["root"] for t in out["trees"]] == [str(kept)] and out["gone"][0]["root"] == str(gone)
    result = cli("verify")
    assert result.exit_code == ExitCode.OK and f"verl at {gone}: gone" in result.stdout
    code, out = cli_json("revert")
    assert code == ExitCode.OK
    assert [t["root"] for t in out["trees"]] == [str(kept)] and out["gone"][0]["root"] == str(gone)
    assert snapshot(kept) == original
    # Only the gone tree is left registered: nothing to act on.
    assert registry(state_home) == [{"root": str(gone), "package": "verl"}]
    for command in ("verify", "revert"):
        code, out = cli_json(command)
        assert code == ExitCode.REFUSED
        assert out["message"] == f"every registered tree is gone: {reason}"
        assert "rlprobe-patch forget PATH" in out["hint"]
    code, out = cli_json("status")
    assert code == ExitCode.OK and out["trees"] == [] and out["gone"][0]["root"] == str(gone)
    code, out = cli_json("forget", gone)
    assert code == ExitCode.OK and out["forgotten"] == [{"root": str(gone), "package": "verl"}]
    assert registry(state_home) == []
    code, out = cli_json("forget", gone)
    assert code == ExitCode.REFUSED and out["message"] == f"not registered: {gone}"


def test_status_prune_drops_only_the_gone_trees(two_trees, state_home: Path) -> None:
    kept, gone, _ = two_trees
    shutil.rmtree(gone)
    code, out = cli_json("status", "--prune")
    assert code == ExitCode.OK
    assert out["pruned"] == [{"root": str(gone), "package": "verl"}]
    assert registry(state_home) == [{"root": str(kept), "package": "verl"}]
    code, out = cli_json("status")
    assert code == ExitCode.OK and out["gone"] == [] and out["pruned"] == []


def test_a_tree_that_comes_back_is_found_again(real_tree, tmp_path: Path) -> None:
    root = real_tree("0.9.1")
    assert cli_json("apply", "--verl-root", root, "--backend", "fsdp")[0] == ExitCode.OK
    away = tmp_path / "away"
    root.rename(away)  # a container path unmounted, a venv moved aside
    code, out = cli_json("status")
    assert code == ExitCode.OK and out["gone"][0]["root"] == str(root)
    assert cli_json("verify")[0] == ExitCode.REFUSED
    away.rename(root)
    code, out = cli_json("verify")
    assert code == ExitCode.OK and out["gone"] == []
    assert [t["tree"]["root"] for t in out["trees"]] == [str(root)]


def test_forget_takes_the_package_folder_and_keeps_the_record(real_tree, state_home: Path) -> None:
    root = real_tree("0.9.1")
    assert cli_json("apply", "--verl-root", root, "--backend", "fsdp")[0] == ExitCode.OK
    result = cli("forget", root / "verl")
    assert result.exit_code == ExitCode.OK
    assert f"forgot verl at {root} (the tree is still there" in result.stdout
    assert registry(state_home) == []
    assert (root / ".rlprobe-patch" / "ledger.json").is_file()
    assert cli_json("verify", "--verl-root", root)[0] == ExitCode.OK  # named, it is still found
