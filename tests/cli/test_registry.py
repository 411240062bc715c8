"""The registry of patched trees lives in a folder of the user's own (issue 13): created private,
refused when another user could change it. (Trees deleted or moved: tests/real/test_registry_real.py.)
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from conftest import cli_json, registry

from rlprobe_patch.base.errors import ExitCode


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
