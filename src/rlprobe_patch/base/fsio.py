"""Files: hashes and reads, writes that land whole or not at all, the per-tree lock, and
fault-injection checkpoints. A leaf: it imports nothing of ours but `errors`."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlprobe_patch.base.errors import LockedError, RefusedError


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def digest(data: bytes | None) -> str:
    """sha256 of the bytes; "" stands for an absent file."""
    return "" if data is None else sha256(data)


def read_or_none(path: Path) -> bytes | None:
    """A file's bytes, or None when it does not exist (a file a patch adds)."""
    return path.read_bytes() if path.is_file() else None


def file_mode(path: Path) -> int:
    return path.stat().st_mode & 0o7777


def dump_json(data: Any) -> bytes:
    """The JSON files we keep (ledger, journal, registry): indented, UTF-8, a final newline."""
    return (json.dumps(data, indent=2) + "\n").encode("utf-8")


def atomic_write(path: Path, data: bytes, mode: int | None = None) -> None:
    """Write `data` to `path` through a temp file in the same folder: fsync, chmod, rename."""
    if mode is None:
        mode = path.stat().st_mode & 0o7777 if path.exists() else 0o644
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".rlprobe-tmp", dir=path.parent)
    except OSError as exc:  # the file asked for is what cannot be written, not our temporary name beside it
        raise OSError(exc.errno, exc.strerror, str(path)) from exc
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        checkpoint(f"rename {path.name}")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def create_new(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Create `path`, which must not exist yet (not even as a symbolic link someone planted)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def remove_stale_temp_files(path: Path) -> None:
    """Remove temp files that a killed `atomic_write(path)` left beside `path`."""
    for stale in path.parent.glob(f".{path.name}.*.rlprobe-tmp"):
        stale.unlink(missing_ok=True)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def locked(lock_path: Path, timeout: float | None, what: str) -> Iterator[None]:
    """Hold an exclusive lock on `lock_path`; wait up to `timeout` seconds, then refuse (None: wait as long as
    it takes, for a cache that another process fills: a download, a venv build)."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    try:  # never through a symbolic link: the pid written below would land in the file it names
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise RefusedError(f"{lock_path} is a symbolic link; refusing to open it", hint="remove it") from None
    try:
        _acquire(fd, timeout, lock_path, what)
        with contextlib.suppress(OSError):  # the holder's pid only serves messages; a full disk may refuse it
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)  # closing drops the flock


def _acquire(fd: int, timeout: float | None, lock_path: Path, what: str) -> None:
    if timeout is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise LockedError(
                    f"{what} is locked by another rlprobe-patch run{_read_holder(lock_path)}",
                    hint="wait for it to finish, or pass --lock-timeout SECONDS to wait longer",
                ) from None
            time.sleep(0.05)


def _read_holder(lock_path: Path) -> str:
    try:
        pid = lock_path.read_text().strip()
    except OSError:
        return ""
    return f" (pid {pid})" if pid else ""


# -- fault injection, for the crash tests ----------------------------------------------------
# RLPROBE_PATCH_FAULT="kill-at=N"   SIGKILL this process at the N-th write checkpoint (1-based)
# RLPROBE_PATCH_FAULT="delay=SECS"  sleep at every write checkpoint (to kill at random points)
# RLPROBE_PATCH_FAULT="enospc-at=N" fail the N-th write checkpoint with OSError(ENOSPC): a full disk
_checkpoints_passed = 0


def checkpoint(name: str) -> None:
    global _checkpoints_passed
    fault = os.environ.get("RLPROBE_PATCH_FAULT")
    if not fault:
        return
    _checkpoints_passed += 1
    kind, _, value = fault.partition("=")
    if kind == "kill-at" and _checkpoints_passed == int(value):
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "enospc-at" and _checkpoints_passed == int(value):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), name)
    elif kind == "delay":
        time.sleep(float(value))
    elif kind == "list":
        print(f"checkpoint {_checkpoints_passed}: {name}", flush=True)
