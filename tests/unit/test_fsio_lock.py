"""`fsio.locked`: the one lock of the engine, the per-tree lock (a timeout, then refused) and the caches' (the wheel
download, the demo's venvs: waited for as long as the holder takes)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlprobe_patch.base.errors import LockedError
from rlprobe_patch.base.fsio import locked

HOLD = """
import sys, time
from pathlib import Path
from rlprobe_patch.base.fsio import locked
with locked(Path(sys.argv[1]), None, "the cache"):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def _holder(lock: Path, seconds: float) -> subprocess.Popen[str]:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(lock), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    return holder


def test_without_a_timeout_the_second_waits_until_the_first_is_done(tmp_path: Path) -> None:
    lock = tmp_path / "cache" / ".lock"
    holder = _holder(lock, 1.0)
    start = time.monotonic()
    with locked(lock, None, "the cache"):
        waited = time.monotonic() - start
    holder.wait(timeout=10)
    assert waited > 0.5  # the holder slept 1 s with the lock held
    assert lock.read_text() == f"{os.getpid()}\n"  # its own pid now, for messages


def test_with_a_timeout_the_second_is_refused_naming_the_holder(tmp_path: Path) -> None:
    lock = tmp_path / ".lock"
    holder = _holder(lock, 5.0)
    try:
        with pytest.raises(LockedError, match=rf"the tree is locked by another rlprobe-patch run \(pid {holder.pid}\)"):
            with locked(lock, 0.2, "the tree"):
                pass
    finally:
        holder.kill()
        holder.wait()
