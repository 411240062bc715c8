"""The record folder inside a tree is untrusted input: running rlprobe-patch on a tree never runs
code planted there (issue 13).

Each vector is planted into a real patched verl 0.9.1 tree, then every command runs as usual:
status, verify, verify --recheck, apply of another patch, revert (stopped by a real edit) and
revert --merge. A planted command would create a marker file; it never does. Each command
either refuses (exit 3) naming the planted key or file, or completes with the planted thing
inert.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import REPO, cli_json, snapshot

from rlprobe_patch.errors import ExitCode

FSDP = "verl/workers/engine/fsdp/transformer_impl.py"
HOOK_NAMES = (
    "reference-transaction",
    "pre-auto-gc",
    "post-update",
    "pre-commit",
    "post-commit",
    "post-checkout",
    "post-merge",
    "post-index-change",
    "fsmonitor-watchman",
)


def script(path: Path, marker: Path) -> Path:
    """An executable that proves it ran by creating `marker` (appending its own name)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\necho {path.name} "$@" >> {marker}\ncat >/dev/null 2>&1 </dev/null\nexit 0\n')
    path.chmod(0o755)
    return path


def add_config(git_dir: Path, text: str) -> None:
    with open(git_dir / "config", "a") as f:
        f.write(text)


def evil_hooks(folder: Path, marker: Path) -> Path:
    for name in HOOK_NAMES:
        script(folder / name, marker)
    return folder


# Each vector plants into (history.git, tree root, scratch folder, marker) and says what a refusal
# must name (None: the commands must complete, the planted thing inert).
Plant = Callable[[Path, Path, Path, Path], None]


def plant_hooks(git_dir: Path, root: Path, tmp: Path, marker: Path) -> None:
    evil_hooks(git_dir / "hooks", marker)


def plant_hooks_path(git_dir: Path, root: Path, tmp: Path, marker: Path) -> None:
    add_config(git_dir, f"[core]\n\thooksPath = {evil_hooks(tmp / 'evil-hooks', marker)}\n")


def plant_fsmonitor(git_dir: Path, root: Path, tmp: Path, marker: Path) -> None:
    add_config(git_dir, f"[core]\n\tfsmonitor = {script(tmp / 'fsmonitor', marker)}\n")


def plant_pager(git_dir: Path, root: Path, tmp: Path, marker: Path) -> None:
    pager = script(tmp / "pager", marker)
    add_config(git_dir, f"[core]\n\tpager = {pager}\n[pager]\n\tlog = {pager}\n\tdiff = {pager}\n")


def plant_alias(git_dir: Path, root: Path, tmp: Path, marker: Path) -> None:
    add_config(git_dir, f"[alias]\n\tupdate-refs = !{script(tmp / 'alias', marker)}\n")


def plant_filter(git_dir: Path, root: Path, tmp: Path, marker: Path) -> None:
    filt = script(tmp / "filter", marker)
    add_config(git_dir, f'[filter "evil"]\n\tclean = {filt}\n\tsmudge = {filt}\n\tprocess = {filt}\n')
    (git_dir / "info").mkdir(exist_ok=True)
    (git_dir / "info" / "attributes").write_text("* filter=evil diff=evil\n")
    (root / ".gitattributes").write_text("* filter=evil diff=evil\n")


def plant_textconv(git_dir: Path, root: Path, tmp: Path, marker: Path) -> None:
    add_config(git_dir, f'[diff "evil"]\n\ttextconv = {script(tmp / "textconv", marker)}\n')
    (root / ".gitattributes").write_text("* diff=evil\n")


def plant_ssh_command(git_dir: Path, root: Path, tmp: Path, marker: Path) -> None:
    add_config(git_dir, f"[core]\n\tsshCommand = {script(tmp / 'ssh', marker)}\n")


def plant_include(git_dir: Path, root: Path, tmp: Path, marker: Path) -> None:
    included = tmp / "evil.config"
    included.write_text(f"[core]\n\thooksPath = {evil_hooks(tmp / 'evil-hooks', marker)}\n")
    add_config(git_dir, f"[include]\n\tpath = {included}\n")


def plant_include_if(git_dir: Path, root: Path, tmp: Path, marker: Path) -> None:
    included = tmp / "evil.config"
    included.write_text(f"[core]\n\thooksPath = {evil_hooks(tmp / 'evil-hooks', marker)}\n")
    add_config(git_dir, f'[includeIf "gitdir:/"]\n\tpath = {included}\n')


def plant_diff_external(git_dir: Path, root: Path, tmp: Path, marker: Path) -> None:
    add_config(git_dir, f"[diff]\n\texternal = {script(tmp / 'external-diff', marker)}\n")


def plant_commondir(git_dir: Path, root: Path, tmp: Path, marker: Path) -> None:
    """`commondir` makes git take its config (and hooks) from another folder."""
    other = tmp / "other.git"
    subprocess.run(["git", "init", "-q", "--bare", str(other)], check=True)
    add_config(other, f"[core]\n\thooksPath = {evil_hooks(tmp / 'evil-hooks', marker)}\n")
    (git_dir / "commondir").write_text(f"{other}\n")


def plant_tree_repository(git_dir: Path, root: Path, tmp: Path, marker: Path) -> None:
    """The tree is itself a git checkout (a verl clone) with hooks, fsmonitor, filters: not our record."""
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    filt = script(tmp / "filter", marker)
    add_config(
        root / ".git",
        f"[core]\n\thooksPath = {evil_hooks(tmp / 'evil-hooks', marker)}\n\tfsmonitor = {filt}\n\tpager = {filt}\n"
        f'[filter "evil"]\n\tclean = {filt}\n\tsmudge = {filt}\n[diff "evil"]\n\ttextconv = {filt}\n'
        f"[diff]\n\texternal = {filt}\n",
    )
    (root / ".gitattributes").write_text("* filter=evil diff=evil\n")
    evil_hooks(root / ".git" / "hooks", marker)


VECTORS: dict[str, tuple[Plant, str | None]] = {
    "hooks": (plant_hooks, "hooks/reference-transaction"),
    "core.hooksPath": (plant_hooks_path, "core.hookspath"),
    "core.fsmonitor": (plant_fsmonitor, "core.fsmonitor"),
    "core.pager": (plant_pager, "core.pager"),
    "alias": (plant_alias, "alias.update-refs"),
    "filter": (plant_filter, "filter.evil.clean"),
    "diff.textconv": (plant_textconv, "diff.evil.textconv"),
    "core.sshCommand": (plant_ssh_command, "core.sshcommand"),
    "include.path": (plant_include, "include.path"),
    "includeIf": (plant_include_if, "includeif.gitdir:/.path"),
    "diff.external": (plant_diff_external, "diff.external"),
    "commondir": (plant_commondir, "commondir"),
    "tree is a git checkout": (plant_tree_repository, None),
}


def commands(root: Path) -> list[tuple[str, list[str], set[int]]]:
    """(name, argv, exit codes it has when nothing is refused)."""
    r = ["--verl-root", str(root)]
    return [
        ("status", ["status", *r], {ExitCode.OK}),
        ("verify", ["verify", *r], {ExitCode.OK}),
        ("verify --recheck", ["verify", *r, "--recheck"], {ExitCode.OK}),
        ("apply another patch", ["apply", *r, "--backend", "fsdp", "--only", "verl.debug-metrics"], {ExitCode.OK}),
        ("edit", [], set()),
        ("revert", ["revert", *r], {ExitCode.REVERT_BLOCKED}),
        ("revert --merge", ["revert", *r, "--merge"], {ExitCode.OK}),
    ]


@pytest.mark.real
@pytest.mark.parametrize("vector", list(VECTORS))
def test_planted_vector_never_runs(real_tree, tmp_path: Path, vector: str) -> None:
    root = real_tree("0.9.1")
    assert cli_json("apply", "--verl-root", root, "--backend", "fsdp")[0] == ExitCode.OK
    git_dir = root / ".rlprobe-patch" / "history.git"
    marker = tmp_path / "MARKER"
    plant, refusal = VECTORS[vector]
    plant(git_dir, root, tmp_path, marker)
    before = snapshot(root)
    for name, argv, expected in commands(root):
        if not argv:  # a real edit after apply, away from the hook: revert stops, revert --merge keeps it
            with open(root / FSDP, "a") as f:
                f.write("\n# my own edit after apply\n")
            before = snapshot(root)
            continue
        code, out = cli_json(*argv)
        assert not marker.exists(), f"{vector}: planted code ran during {name}: {marker.read_text()}"
        if refusal is None:
            assert code in expected, (name, out)
        else:
            assert code == ExitCode.REFUSED, (name, out)
            assert refusal in out["message"] + " ".join(out["details"]), (name, out)
            assert "--trust-record" not in out["hint"] or vector == "owner"
            assert snapshot(root) == before, f"{name} wrote to the tree"
    if refusal is None:
        text = (root / FSDP).read_text()
        assert "# my own edit after apply" in text and "rlprobe-patch" not in text


def run_isolated(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rlprobe_patch", *args], capture_output=True, text=True, env=env, cwd=REPO
    )


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


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)
