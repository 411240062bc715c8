"""Errors users see, each with its documented exit code."""

from __future__ import annotations

import enum
import importlib
import sys


class ExitCode(enum.IntEnum):
    OK = 0
    INTERNAL = 1  # a bug: an unexpected exception
    USAGE = 2  # bad command line (click's own code)
    REFUSED = 3  # not a tree, unsupported version, anchor missing/ambiguous, drifted, unreadable target
    VERIFY_FAILED = 4  # verify found a hook missing, a file not compiling or a file changed since apply
    REVERT_BLOCKED = 5  # a patched file was edited after apply; nothing written
    LOCKED = 6  # another rlprobe-patch run holds the tree's lock
    WRITE_FAILED = 7  # the disk refused a write (full, I/O error): each file original or patched, journal kept
    NODES_DISAGREE = 8  # cluster status: the nodes of a Ray cluster differ (versions, patch states, records)


class PatchError(Exception):
    """An error with a message meant for the user and a distinct exit code."""

    exit_code = ExitCode.INTERNAL

    def __init__(self, message: str, *, hint: str = "", details: list[str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.details = details or []

    def to_json(self) -> dict[str, object]:
        return {
            "error": type(self).__name__,
            "message": self.message,
            "hint": self.hint,
            "details": self.details,
            "exit_code": int(self.exit_code),
        }


class RefusedError(PatchError):
    exit_code = ExitCode.REFUSED


class NotATreeError(RefusedError):
    pass


class InterpreterError(RefusedError):
    """The Python given (`--python`, else this one) could not be run, or what it ran failed (exit 3)."""


class UsageError(PatchError):
    """A bad combination of options, found inside a command (exit 2, like click's own usage errors)."""

    exit_code = ExitCode.USAGE


class RevertBlockedError(PatchError):
    exit_code = ExitCode.REVERT_BLOCKED


class LockedError(PatchError):
    exit_code = ExitCode.LOCKED


class WriteFailedError(PatchError):
    exit_code = ExitCode.WRITE_FAILED


# Modules a command needs that a broken install can lack (`pip install --no-deps`): the requirement to name.
REQUIREMENTS = {"numpy": "numpy>=1.24", "matplotlib": "matplotlib>=3.7"}


def require(module: str, what: str) -> None:
    """Refuse at the start of `what` when `module` cannot be imported, naming the line that installs it here.

    numpy is a dependency (and the `report` extra): the README's `pip install .` brings it, so this
    is for an install without its dependencies, found before any work starts, not ten minutes in.
    """
    try:
        importlib.import_module(module)
    except ImportError:
        requirement = REQUIREMENTS.get(module, module)
        raise RefusedError(
            f"{what} needs {module}, which this Python cannot import ({sys.executable})",
            hint=f"{sys.executable} -m pip install '{requirement}' (or pip install 'rlprobe-patch[report]')",
        ) from None
