"""A patch's `payload.py`, loaded: the methods, statement hooks and definitions the operations insert."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import libcst as cst

from rlprobe_patch.codemod._operations import Statement
from rlprobe_patch.codemod._payload_parts import assemble
from rlprobe_patch.codemod._syntax import defined_name, is_class, is_def, without_docstring


class Payload:
    """A patch's `payload.py`: methods in classes, statement hooks as module-level functions.

    Methods the payload takes from `patches/_shared/` are spliced in when it is loaded
    (`_payload_parts.assemble`); `sources` are the files the inserted code comes from."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.module, shared = assemble(path)
        self.sources = (path, *shared)

    def methods(self, cls: str) -> list[cst.FunctionDef]:
        for stmt in self.module.body:
            if is_class(stmt, cls):
                assert isinstance(stmt, cst.ClassDef) and isinstance(stmt.body, cst.IndentedBlock)
                return [s for s in stmt.body.body if isinstance(s, cst.FunctionDef)]
        raise KeyError(f"{self.path}: no class {cls}")

    def definitions(self, names: Sequence[str]) -> list[Statement]:
        found: list[Statement] = [stmt for stmt in self.module.body if defined_name(stmt) in names]
        if missing := set(names) - {defined_name(stmt) for stmt in found}:
            raise KeyError(f"{self.path}: no module-level definition of {sorted(missing)}")
        return found

    def statements(self, hook: str) -> list[Statement]:
        for stmt in self.module.body:
            if is_def(stmt, hook):
                assert isinstance(stmt, cst.FunctionDef) and isinstance(stmt.body, cst.IndentedBlock)
                return list(without_docstring(stmt.body.body))
        raise KeyError(f"{self.path}: no statement hook {hook}")
