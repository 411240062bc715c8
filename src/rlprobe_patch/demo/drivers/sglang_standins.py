"""Stand-ins for running SGLang's real `ModelRunner.forward` without SGLang importable (it needs
CUDA kernels): the consistency demo and the runtime tests' SGLang driver both use them.

Real: the method's source, taken from the patched model_runner.py, and the dispatch_logger.py
rlprobe-patch added. Stand-ins: the forward mode enum (our own, with SGLang's member names), the
module-level helpers the method reads (`Inert`), and the packages above the logger module.
"""

from __future__ import annotations

import ast
import builtins
import enum
import importlib.util
import sys
import types
from pathlib import Path


class ForwardMode(enum.IntEnum):
    """Our own enum with the member names SGLang's ForwardMode uses for these passes."""

    EXTEND = enum.auto()
    DECODE = enum.auto()
    MIXED = enum.auto()
    IDLE = enum.auto()


class Inert:
    """A module-level helper of model_runner.py that does nothing here: callable, a context
    manager, falsy, every attribute another Inert."""

    def __call__(self, *args: object, **kwargs: object) -> Inert:
        return self

    def __getattr__(self, name: str) -> Inert:
        return self

    def __enter__(self) -> Inert:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __bool__(self) -> bool:
        return False

    def __gt__(self, other: object) -> bool:
        return False

    def get(self, key: str, default: object = None) -> object:
        return default


def free_names(fn: ast.FunctionDef) -> set[str]:
    """Names `fn` reads that it neither binds nor gets from builtins: module-level names."""
    bound = {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
    bound |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    loads = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return {n for n in loads - bound if not hasattr(builtins, n)}


def load_logger_module(path: Path) -> None:
    """The added dispatch_logger.py, importable under its real name for the inserted statement."""
    name = "sglang.srt.model_executor.dispatch_logger"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    for package in ("sglang", "sglang.srt", "sglang.srt.model_executor"):
        sys.modules.setdefault(package, types.ModuleType(package))
    sys.modules[name] = module
    spec.loader.exec_module(module)
