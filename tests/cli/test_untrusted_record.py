"""The record folder inside a tree is untrusted input: running rlprobe-patch on a tree never runs
code planted there (issue 13).

The fast part: the user's own git configuration is not read either, our lock never follows a
symbolic link, only gitsafe.py starts git, and lock files a killed git leaves are accepted. The
vectors planted into real patched trees: tests/real/test_untrusted_record_real.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import REPO, cli_json
from planted_code import evil_hooks, run_isolated, script

from rlprobe_patch.base.errors import ExitCode


def test_config_from_system_and_global_files_is_not_read(fixture_tree, tmp_path: Path) -> None:
    """The user's ~/.gitconfig and the system config (here through GIT_CONFIG_SYSTEM) are not read either."""
    marker = tmp_path / "MARKER"
    home = tmp_path / "home"
    home.mkdir()
    filt = script(tmp_path / "filter", marker)
    config = (
        f"[core]\n\thooksPath = {evil_hooks(tmp_path / 'evil-hooks', marker)}\n\tfsmonitor = {filt}\n"
        f"\tpager = {filt}\n[diff]\n\texternal = {filt}\n"
    )
    (home / ".gitconfig").write_text(config)
    (tmp_path / "system.config").write_text(config)
    env = {
        **os.environ,
        "HOME": str(home),
        "GIT_CONFIG_SYSTEM": str(tmp_path / "system.config"),
        "PYTHONPATH": str(REPO / "src"),
    }
    env.pop("GIT_CONFIG_GLOBAL", None)
    env.pop("GIT_CONFIG_NOSYSTEM", None)
    root = fixture_tree("0.9")
    for argv in (["apply", "--backend", "fsdp"], ["verify"], ["status"], ["revert"]):
        proc = run_isolated(*argv, "--verl-root", str(root), env=env)
        assert proc.returncode == 0, proc.stderr
        assert not marker.exists(), f"{argv}: {marker.read_text()}"


def test_lock_never_follows_a_symbolic_link(tmp_path: Path) -> None:
    from rlprobe_patch.base.errors import RefusedError
    from rlprobe_patch.base.fsio import locked

    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / "lock").symlink_to(victim)
    with pytest.raises(RefusedError, match="is a symbolic link"), locked(tmp_path / "lock", 1, "x"):
        pass
    assert victim.read_text() == "precious\n"


def test_no_git_call_outside_gitsafe() -> None:
    """Only gitsafe.py starts git: no `["git", ...]` command line, no GitPython Repo or Git built elsewhere."""
    import ast

    offenders = []
    for path in sorted((REPO / "src" / "rlprobe_patch").rglob("*.py")):
        if path.name == "gitsafe.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.List) and node.elts and isinstance(node.elts[0], ast.Constant):
                if node.elts[0].value == "git":
                    offenders.append(f"{path.name}:{node.lineno}: a git command line")
            if isinstance(node, ast.Call) and "git." in ast.unparse(node.func):
                name = ast.unparse(node.func)
                if name.startswith("git.") and name.split(".")[1] in ("Repo", "Git", "cmd"):
                    offenders.append(f"{path.name}:{node.lineno}: {name}()")
    assert offenders == []


def test_lock_files_left_by_a_killed_git_are_accepted(fixture_tree) -> None:
    """A git killed mid-write leaves `config.lock` or `HEAD.lock`; git never reads them: not refused."""
    root = fixture_tree("0.9")
    assert cli_json("apply", "--verl-root", root, "--backend", "fsdp")[0] == ExitCode.OK
    git_dir = root / ".rlprobe-patch" / "history.git"
    (git_dir / "config.lock").write_text("[core]\n\thooksPath = /tmp\n")
    (git_dir / "HEAD.lock").write_text("ref: refs/heads/verl\n")
    assert cli_json("verify", "--verl-root", root)[0] == ExitCode.OK
    (git_dir / "hooks").mkdir()
    (git_dir / "hooks" / "pre-commit.sample").write_text("#!/bin/sh\n")  # git's samples are inert
    assert cli_json("status", "--verl-root", root)[0] == ExitCode.OK
