"""`same_syntax` (which decides applied / applicable / drifted) against Python's own `ast`.

`same_syntax` compares only the statements that differ in identity, walking into classes,
functions and compound statements. Property: for a module and a randomly edited copy that
shares the untouched nodes, it answers exactly what comparing the `ast.dump` of both whole
files answers. The edits: delete, duplicate, insert or change a statement, rebuild one as a
new object, reformat it (comments, spacing), merge two lines into `a; b`, at any depth.
"""

from __future__ import annotations

import ast
from pathlib import Path

import hypothesis.strategies as st
import libcst as cst
from conftest import FIXTURES
from hypothesis import HealthCheck, given, settings

from rlprobe_patch.codemod import same_syntax

SOURCES = sorted(p for p in FIXTURES.rglob("*.py") if p.stat().st_size > 400)
MODULES = {p: cst.parse_module(p.read_bytes()) for p in SOURCES}
EDITS = ("delete", "duplicate", "insert", "change", "rebuild", "reformat", "semicolons", "descend")


def reference(a: cst.Module, b: cst.Module) -> bool:
    return ast.dump(ast.parse(a.code)) == ast.dump(ast.parse(b.code))


def reformatted(stmt: cst.BaseStatement) -> cst.BaseStatement:
    """The same statement as a new object with other formatting: a comment line above it."""
    code = cst.Module(body=[stmt]).code
    return cst.parse_statement("# reformatted\n" + code.replace(" = ", " =  ", 1).replace(",", " ,", 1))


def edit(body: list[cst.BaseStatement], data: st.DataObject, depth: int) -> list[cst.BaseStatement]:
    body = list(body)
    i = data.draw(st.integers(0, len(body) - 1))
    stmt = body[i]
    kind = data.draw(st.sampled_from(EDITS))
    nested = isinstance(stmt, cst.BaseCompoundStatement) and isinstance(stmt.body, cst.IndentedBlock)
    if kind == "descend" and nested and depth < 6:
        inner = edit(list(stmt.body.body), data, depth + 1)  # type: ignore[union-attr]
        body[i] = stmt.with_changes(body=stmt.body.with_changes(body=inner))  # type: ignore[union-attr]
    elif kind == "delete" and len(body) > 1:
        del body[i]
    elif kind == "duplicate":
        body.insert(i, stmt)
    elif kind == "insert":
        body.insert(i, cst.parse_statement("x = 1\n"))
    elif kind == "change" and isinstance(stmt, cst.SimpleStatementLine):
        body[i] = cst.parse_statement("y = 2\n")
    elif kind == "rebuild":
        body[i] = stmt.with_changes()
    elif kind == "reformat":
        body[i] = reformatted(stmt)
    elif kind == "semicolons" and i + 1 < len(body):
        first, second = body[i], body[i + 1]
        if isinstance(first, cst.SimpleStatementLine) and isinstance(second, cst.SimpleStatementLine):
            body[i : i + 2] = [first.with_changes(body=[*first.body, *second.body])]
    return body


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(SOURCES), st.data())
def test_same_syntax_agrees_with_ast(path: Path, data: st.DataObject) -> None:
    a = MODULES[path]
    b = a
    for _ in range(data.draw(st.integers(1, 3))):
        b = b.with_changes(body=edit(list(b.body), data, 0))
    assert same_syntax(a, b) == reference(a, b)
    assert same_syntax(b, a) == reference(a, b)


def test_the_edits_reach_both_answers() -> None:
    """The property is not vacuous: both answers occur among simple fixed edits."""
    module = next(iter(MODULES.values()))
    rebuilt = module.with_changes(body=[s.with_changes() for s in module.body])
    assert same_syntax(module, rebuilt) and reference(module, rebuilt)
    shorter = module.with_changes(body=module.body[:-1])
    assert not same_syntax(module, shorter) and not reference(module, shorter)
