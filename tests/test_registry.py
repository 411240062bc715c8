"""The registry of patched trees survives trees that are deleted or moved (issue 14, item 5), and
lives in a folder of the user's own (issue 13).

Argument-less `status` lists every registered tree and marks the gone ones; `verify` and
`revert` act on the trees that exist and name the gone ones (exit 3 only when every registered
tree is gone); `forget PATH` and `status --prune` drop entries; a tree that comes back at the
same path is found again.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest
from conftest import cli, cli_json, snapshot

from rlprobe_patch.errors import ExitCode


def registry(state_home: Path) -> list[dict[str, str]]:
    return json.loads((state_home / "registry.json").read_text())["trees"]


@pytest.fixture
def two_trees(real_tree) -> tuple[Path, Path, dict]:
    """verl 0.9.1 and 0.8.0, both patched and registered: (kept, deleted later, kept's original snapshot)."""
    kept, other = real_tree("0.9.1"), real_tree("0.8.0")
    original = snapshot(kept)
    for root in (kept, other):
        assert cli_json("apply", "--verl-root", root, "--backend", "fsdp")[0] == ExitCode.OK
    return kept, other, original


@pytest.mark.real
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


@pytest.mark.real
def test_status_prune_drops_only_the_gone_trees(two_trees, state_home: Path) -> None:
    kept, gone, _ = two_trees
    shutil.rmtree(gone)
    code, out = cli_json("status", "--prune")
    assert code == ExitCode.OK
    assert out["pruned"] == [{"root": str(gone), "package": "verl"}]
    assert registry(state_home) == [{"root": str(kept), "package": "verl"}]
    code, out = cli_json("status")
    assert code == ExitCode.OK and out["gone"] == [] and out["pruned"] == []


@pytest.mark.real
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


@pytest.mark.real
def test_forget_takes_the_package_folder_and_keeps_the_record(real_tree, state_home: Path) -> None:
    root = real_tree("0.9.1")
    assert cli_json("apply", "--verl-root", root, "--backend", "fsdp")[0] == ExitCode.OK
    result = cli("forget", root / "verl")
    assert result.exit_code == ExitCode.OK
    assert f"forgot verl at {root} (the tree is still there" in result.stdout
    assert registry(state_home) == []
    assert (root / ".rlprobe-patch" / "ledger.json").is_file()
    assert cli_json("verify", "--verl-root", root)[0] == ExitCode.OK  # named, it is still found


def test_state_folder_is_created_private(fixture_tree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLPROBE_PATCH_STATE_HOME")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    root = fixture_tree("0.9")
    assert cli_json("apply", "--verl-root", root, "--backend", "fsdp")[0] == ExitCode.OK
    folder = tmp_path / "xdg" / "rlprobe-patch"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((folder / "registry.json").stat().st_mode) == 0o600
    assert registry(folder) == [{"root": str(root), "package": "verl"}]


@pytest.mark.parametrize("how", ["owner", "mode", "symlink"])
def test_state_folder_of_someone_else_is_refused(fixture_tree, state_home: Path, tmp_path: Path, how: str) -> None:
    root = fixture_tree("0.9")
    assert cli_json("apply", "--verl-root", root, "--backend", "fsdp")[0] == ExitCode.OK
    path = state_home / "registry.json"
    if how == "owner":
        os.chown(state_home, 4242, 4242)
        expected = f"{state_home} is owned by uid 4242, not by you (uid 0)"
    elif how == "mode":
        state_home.chmod(0o777)
        expected = f"{state_home} is writable by other users (mode 777)"
    else:
        planted = tmp_path / "planted.json"
        planted.write_text(json.dumps({"trees": [{"root": str(root), "package": "verl"}]}))
        path.unlink()
        path.symlink_to(planted)
        expected = f"{path} is not a regular file"
    for argv in (["verify"], ["status"], ["revert"], ["apply", "--verl-root", root, "--backend", "megatron"]):
        code, out = cli_json(*argv)
        assert code == ExitCode.REFUSED, (argv, out)
        assert out["message"] == f"the registry of patched trees: {expected}; refusing to use it", argv
        assert "RLPROBE_PATCH_STATE_HOME" in out["hint"]
    assert not (root / ".rlprobe-patch" / "journal.json").exists()
