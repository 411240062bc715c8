"""Shared payload parts: methods several payloads insert, written once in `patches/_shared/`.

A payload class takes a shared method with one line naming it, `_should_dump =
DumpPhase._should_dump`, where `DumpPhase` is a class of `patches/_shared/<module>.py` that the
payload imports (`from _shared.<module> import DumpPhase`). Loading the payload puts the method in
place of that line, verbatim: the line's own comments and blank lines stay (they are the
payload's), the method's text is the part's. The result is what the codemod inserts, so a
payload assembled from parts inserts exactly the text it did when it held the copies.

A name in capitals in a shared method (`RANK`) is a slot, filled by the payload's module-level
function of that name: its body is comments and one `return EXPR`. On each line that uses the
slot the name becomes EXPR, and the comments go on their own lines above that line.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

import libcst as cst
import libcst.helpers
import libcst.matchers as m

SHARED_PACKAGE = "_shared"
# `name = Part.name` in a payload class: take the method `name` of the shared class `Part`.
_TAKE = m.SimpleStatementLine(
    body=[m.Assign(targets=[m.AssignTarget(m.Name())], value=m.Attribute(value=m.Name(), attr=m.Name()))]
)


class PartError(Exception):
    """A payload names a shared part or slot that does not exist, or fills a slot wrongly."""


@dataclass(frozen=True)
class Fill:
    """What a payload puts in place of a slot: an expression, with comment lines above it."""

    expression: str
    comments: tuple[str, ...]


def assemble(path: Path) -> tuple[cst.Module, tuple[Path, ...]]:
    """The payload at `path` with every shared method it takes spliced in, and the shared files used."""
    module = cst.parse_module(path.read_bytes())
    parts = _imported_parts(module, path.parent.parent / SHARED_PACKAGE)
    if not parts:
        return module, ()
    fills = _fills(module)
    used: set[Path] = set()

    def splice(stmt: cst.BaseStatement) -> cst.BaseStatement:
        if not (isinstance(stmt, cst.SimpleStatementLine) and m.matches(stmt, _TAKE)):
            return stmt
        assign = cst.ensure_type(stmt.body[0], cst.Assign)
        taken = cst.ensure_type(assign.value, cst.Attribute)
        name = cst.ensure_type(assign.targets[0].target, cst.Name).value
        part, method = cst.ensure_type(taken.value, cst.Name).value, taken.attr.value
        if part not in parts:
            return stmt  # a plain class attribute, not a part
        if name != method:
            raise PartError(f"{path}: `{name} = {part}.{method}`: a shared method keeps its name")
        shared = parts[part]
        used.add(shared)
        return _shared_method(shared, part, method, fills).with_changes(leading_lines=stmt.leading_lines)

    body = []
    for stmt in module.body:
        if isinstance(stmt, cst.ClassDef) and isinstance(stmt.body, cst.IndentedBlock):
            stmt = stmt.with_changes(body=stmt.body.with_changes(body=[splice(s) for s in stmt.body.body]))
        body.append(stmt)
    return module.with_changes(body=body), tuple(sorted(used))


def _imported_parts(module: cst.Module, shared_dir: Path) -> dict[str, Path]:
    """{class name: shared file} for every `from _shared.<module> import Class` of the payload."""
    parts = {}
    for stmt in module.body:
        for small in stmt.body if isinstance(stmt, cst.SimpleStatementLine) else ():
            if not isinstance(small, cst.ImportFrom) or isinstance(small.names, cst.ImportStar):
                continue
            dotted = cst.helpers.get_full_name_for_node(small.module) if small.module else ""
            package, _, name = (dotted or "").partition(".")
            if package == SHARED_PACKAGE:
                parts.update({alias.evaluated_name: shared_dir / f"{name}.py" for alias in small.names})
    return parts


def _fills(module: cst.Module) -> dict[str, Fill]:
    """The payload's slot fills: module-level functions named in capitals."""
    fills = {}
    for stmt in module.body:
        if not (isinstance(stmt, cst.FunctionDef) and stmt.name.value.isupper()):
            continue
        body = list(cst.ensure_type(stmt.body, cst.IndentedBlock).body)
        if body and m.matches(body[0], m.SimpleStatementLine(body=[m.Expr(m.SimpleString())])):
            body = body[1:]  # the docstring
        returned = m.SimpleStatementLine(body=[m.Return(value=m.DoNotCare())])
        if len(body) != 1 or not m.matches(body[0], returned):
            raise PartError(f"slot fill {stmt.name.value}: the body must be one `return EXPR` (comments above it)")
        line = cst.ensure_type(body[0], cst.SimpleStatementLine)
        value = cst.ensure_type(line.body[0], cst.Return).value
        assert value is not None
        expression = module.code_for_node(value)
        if "\n" in expression:
            raise PartError(f"slot fill {stmt.name.value}: the expression must fit on one line")
        comments = tuple(empty.comment.value for empty in line.leading_lines if empty.comment)
        fills[stmt.name.value] = Fill(expression, comments)
    return fills


def _shared_method(shared: Path, part: str, method: str, fills: dict[str, Fill]) -> cst.FunctionDef:
    """Method `method` of class `part` in the file `shared`, its slots filled, without leading lines."""
    source = _parse(shared)
    method_node, code, slots = _method_and_slots(source, shared, part, method)
    if not slots:
        return method_node  # nothing to fill: the node itself
    used = tuple(sorted((n, fills[n]) for n in {n for _, _, n in slots} if n in fills))
    return _filled(source, code, slots, used, f"{part}.{method}")


# Several payloads take the same shared methods, with the same fills: each is made once per
# process (the shared file's syntax tree is the key: `_parse` keeps one per content).
@functools.cache
def _method_and_slots(
    source: cst.Module, shared: Path, part: str, method: str
) -> tuple[cst.FunctionDef, str, tuple[tuple[int, int, str], ...]]:
    found = [
        fn
        for cls in source.body
        if isinstance(cls, cst.ClassDef) and cls.name.value == part
        for fn in cst.ensure_type(cls.body, cst.IndentedBlock).body
        if isinstance(fn, cst.FunctionDef) and fn.name.value == method
    ]
    if len(found) != 1:
        raise PartError(f"{shared}: no method {part}.{method}")
    method_node = found[0].with_changes(leading_lines=[])
    code = source.code_for_node(method_node)
    return method_node, code, tuple(_slots(code))


@functools.cache
def _filled(
    source: cst.Module,
    code: str,
    slots: tuple[tuple[int, int, str], ...],
    fills: tuple[tuple[str, Fill], ...],
    where: str,
) -> cst.FunctionDef:
    filled = _fill_slots(code, list(slots), dict(fills), where)  # a slot without a fill: PartError
    spliced = cst.parse_module(filled, config=source.config_for_parsing).body[0]
    assert isinstance(spliced, cst.FunctionDef)
    return spliced


def _slots(code: str) -> list[tuple[int, int, str]]:
    """(line, byte column, name) of each slot in `code`: every name in capitals."""
    return [
        (node.lineno, node.col_offset, node.id)
        for node in ast.walk(ast.parse(code))
        if isinstance(node, ast.Name) and node.id.isupper()
    ]


def _fill_slots(code: str, slots: list[tuple[int, int, str]], fills: dict[str, Fill], where: str) -> str:
    lines = [line.encode() for line in code.splitlines(keepends=True)]
    rows: dict[int, list[tuple[int, str]]] = {}
    for row, column, name in slots:
        if name not in fills:
            raise PartError(f"{where}: the payload has no fill for the slot {name} (a function `def {name}`)")
        rows.setdefault(row, []).append((column, name))
    # Bottom-up, and right to left on a line: the positions not yet edited stay valid. The
    # comments of every fill on a line go above it once the line is filled.
    for row in sorted(rows, reverse=True):
        line = lines[row - 1]
        indent = line[: len(line) - len(line.lstrip())]
        comments: list[str] = []
        for column, name in sorted(rows[row], reverse=True):
            fill = fills[name]
            line = line[:column] + fill.expression.encode() + line[column + len(name) :]
            comments[:0] = fill.comments
        lines[row - 1 : row] = [*(indent + comment.encode() + b"\n" for comment in comments), line]
    return b"".join(lines).decode()


_PARSED: dict[Path, tuple[bytes, cst.Module]] = {}


def _parse(path: Path) -> cst.Module:
    """A shared file, parsed once per content."""
    data = path.read_bytes()
    cached = _PARSED.get(path)
    if cached is None or cached[0] != data:
        cached = _PARSED[path] = (data, cst.parse_module(data))
    return cached[1]
