"""Every git command rlprobe-patch runs, isolated from what it does not own. The one place that
builds git's environment: `run_git` for the commands we spawn, `open_repository` for GitPython
(imported only there: importing it runs `git version` twice).

The record (`.rlprobe-patch/history.git`) lives inside trees that other people can often write
(a shared /verl, an image layer, a copied tree), and rlprobe-patch often runs as root. So git
reads no system or global configuration, runs no hook (`core.hooksPath=/dev/null`: a hook would
have to be a file inside /dev/null, which nobody can create), no fsmonitor, no pager, no
attribute-driven filter or diff driver, and follows no replace ref. The configuration git still
reads, the record's own `history.git/config`, is checked before use (`record.folder.RecordFolder.check`):
it may hold only the keys rlprobe-patch writes, so no alias, filter, textconv, external diff,
include or command can come from it. Commands that need no repository get `GIT_DIR=/dev/null`,
so that they never find one around the tree (a verl clone's `.git`, or a planted one).
"""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import git

NO_REPOSITORY = os.devnull

# Passed as GIT_CONFIG_COUNT/KEY/VALUE: command-line configuration, which wins over every file.
ISOLATION_CONFIG: dict[str, str] = {
    "core.hooksPath": os.devnull,
    "core.fsmonitor": "false",
    "core.pager": "cat",
    "core.attributesFile": os.devnull,
    "core.askPass": "",
    "core.sshCommand": "false",
    "credential.helper": "",
    "protocol.allow": "never",
    "gc.auto": "0",
    "maintenance.auto": "false",
    "init.defaultBranch": "master",  # no hint on stderr (a write that could kill a git whose parent died)
}

ISOLATION_ENV: dict[str, str] = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_SYSTEM": os.devnull,
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_PARAMETERS": "",
    "GIT_ATTR_NOSYSTEM": "1",
    "GIT_NO_REPLACE_OBJECTS": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_PAGER": "cat",
    "GIT_OPTIONAL_LOCKS": "0",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES": "",
    "LC_ALL": "C",
    "LANGUAGE": "C",
}


def git_env(git_dir: str | os.PathLike[str] = NO_REPOSITORY) -> dict[str, str]:
    """The whole environment of a git command on `git_dir` (a bare repository, or none).

    The caller's own GIT_* variables are dropped: git sees exactly what is set here."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(ISOLATION_ENV)
    env["GIT_DIR"] = str(git_dir)
    if str(git_dir) != NO_REPOSITORY:
        # Pinned, so that neither the caller's environment nor a `commondir` file moves them.
        env["GIT_COMMON_DIR"] = str(git_dir)
        env["GIT_OBJECT_DIRECTORY"] = str(Path(git_dir, "objects"))
    env["GIT_CONFIG_COUNT"] = str(len(ISOLATION_CONFIG))
    for i, (key, value) in enumerate(ISOLATION_CONFIG.items()):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    return env


def run_git(
    args: Sequence[str],
    *,
    git_dir: str | os.PathLike[str] = NO_REPOSITORY,
    cwd: str | os.PathLike[str] | None = None,
    text: bool = False,
) -> subprocess.CompletedProcess[Any]:
    """Run `git ARGS` isolated (see the module's docstring); never raises on a non-zero exit."""
    return subprocess.run(
        ["git", *args],
        cwd=cwd,
        env=git_env(git_dir),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=text,
    )


def open_repository(path: Path) -> git.Repo:
    """history.git through GitPython, its commands isolated like `run_git`'s."""
    return _repository_class()(path)


@functools.cache
def _repository_class() -> type[git.Repo]:
    import git

    class IsolatedGit(git.cmd.Git):
        """GitPython's command runner for a bare repository: every command gets `git_env`.

        GitPython starts from `os.environ` and lays our variables over it, so the caller's GIT_*
        variables that `git_env` does not set survive here; `git_env` sets every one that chooses
        the repository, its objects and its configuration."""

        def execute(self, command: Any, *args: Any, env: Mapping[str, str] | None = None, **kwargs: Any) -> Any:
            git_dir = self._working_dir or NO_REPOSITORY
            return super().execute(command, *args, env={**git_env(git_dir), **(env or {})}, **kwargs)

    class Repository(git.Repo):
        """A bare repository of ours, opened through GitPython: its git commands run through
        `IsolatedGit`, and its configuration is read from the repository's own file only."""

        GitCommandWrapperType = IsolatedGit
        config_level = ("repository",)  # type: ignore[assignment]  # GitPython types it as all four levels

    return Repository


def config_entries(path: Path) -> list[tuple[str, str]]:
    """(key, value) of every entry of a git config file, as git itself reads it (no includes)."""
    proc = run_git(["config", "--file", str(path), "--no-includes", "--list", "--null"])
    if proc.returncode != 0:
        raise ValueError(proc.stderr.decode(errors="replace").strip() or f"git config failed on {path}")
    entries = []
    for item in proc.stdout.split(b"\0"):
        if item:
            key, _, value = item.decode("utf-8", errors="replace").partition("\n")
            entries.append((key, value))
    return entries
