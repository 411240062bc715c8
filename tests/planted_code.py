"""Planted code for the untrusted-record tests (tests/cli/test_untrusted_record.py,
tests/real/test_untrusted_record_real.py): executables that prove they ran, and rlprobe-patch
run as a separate process with the environment a test gives it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import REPO

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


def evil_hooks(folder: Path, marker: Path) -> Path:
    """Every hook git could run, each a `script` that appends to `marker`."""
    for name in HOOK_NAMES:
        script(folder / name, marker)
    return folder


def run_isolated(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`python -m rlprobe_patch ARGS` in its own process, with `env` only."""
    return subprocess.run(
        [sys.executable, "-m", "rlprobe_patch", *args], capture_output=True, text=True, env=env, cwd=REPO
    )
