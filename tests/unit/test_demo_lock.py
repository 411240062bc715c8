"""The consistency demo holds each venv it patches from its patch check to its revert (`demo.consistency.in_use`):
a second demo on the same venv, in another terminal or another test worker, waits instead of patching or
reverting under the first (two demos at once on the cached venvs had failed under `pytest -n auto`)."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rlprobe_patch.demo.consistency import in_use

HOLD = """
import sys
from pathlib import Path
from rlprobe_patch.demo.consistency import in_use
with in_use(Path(sys.argv[1]), print):
    print("held", flush=True)
    sys.stdin.read()  # until the test closes it
"""


def _venv(root: Path, name: str) -> Path:
    python = root / name / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.symlink_to(sys.executable)  # as a venv's: a link to the one interpreter every venv shares
    (python.parent / "python3").symlink_to("python")
    return python


def test_a_second_demo_on_the_same_venv_waits_for_the_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    first, other = _venv(tmp_path, "venv-a"), _venv(tmp_path, "venv-b")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(first)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with in_use(other, pytest.fail):  # another venv: no wait (pytest.fail if it said it waits)
            pass
        said: list[str] = []
        entered = threading.Event()

        def second() -> None:
            with in_use(first.parent / "python3", said.append):  # the same venv through another of its pythons
                entered.set()

        thread = threading.Thread(target=second)
        thread.start()
        assert not entered.wait(1.0), "the second demo went ahead while the first held the venv"
        assert len(said) == 1 and said[0].startswith(f"waiting for another demo that has {first.parent.parent}")
        assert holder.stdin is not None
        holder.stdin.close()  # the first demo is done
        assert entered.wait(30) and holder.wait(30) == 0
        thread.join(30)
    finally:
        holder.kill()


def test_a_lock_planted_as_a_symbolic_link_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache folder is the user's, the tool often runs as root: the lock is never opened through a link."""
    from rlprobe_patch.base.errors import RefusedError
    from rlprobe_patch.demo.consistency import venv_cache

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    python = _venv(tmp_path, "venv-a")
    with in_use(python, pytest.fail):  # the lock the venv's demo takes, found in the cache's locks folder
        (lock,) = (venv_cache() / "locks").iterdir()
    target = tmp_path / "elsewhere"
    target.write_text("precious\n")
    lock.unlink()
    lock.symlink_to(target)
    with pytest.raises(RefusedError, match="symbolic link"), in_use(python, pytest.fail):
        pass
    assert target.read_text() == "precious\n"
