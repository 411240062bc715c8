"""Syntax trees compared and built: a statement's identity by its Python AST (`statement_key`, `same_syntax`,
comparing only what differs in identity), the blocks of a compound statement (`map_blocks`), and the small shapes
the operations read and write (docstrings, definitions, blank lines, a name substituted)."""

from __future__ import annotations

import ast
import functools
import textwrap
from collections.abc import Callable, Sequence
from typing import cast

import libcst as cst
import libcst.helpers
import libcst.matchers as m

from rlprobe_patch.codemod._operations import Statement


@functools.lru_cache(maxsize=16384)  # LibCST nodes are immutable and hash by identity
def statement_key(node: cst.CSTNode) -> str:
    """A formatting-independent identity of a statement: its Python AST."""
    return syntax_key(cst.Module(body=[node]).code)  # type: ignore[list-item]


@functools.lru_cache(maxsize=4096)
def syntax_key(code: str) -> str:
    return ast.dump(ast.parse(textwrap.dedent(code)))


def same_syntax(a: cst.Module, b: cst.Module) -> bool:
    """Whether two modules have the same Python syntax tree (formatting and comments aside).

    A transform leaves the nodes it does not edit as the very same objects, so only the
    statements that differ in identity are generated and parsed: a few methods, not the file.
    """
    return _same_body(a.body, b.body)


def _ast_width(stmt: Statement) -> int:
    """How many statements of Python's AST the node stands for (`a; b` on one line is two)."""
    return len(stmt.body) if isinstance(stmt, cst.SimpleStatementLine) else 1


def _same_body(xs: Sequence[Statement], ys: Sequence[Statement]) -> bool:
    i = 0
    # While the two lists stand for the same number of AST statements, item by item, comparing
    # items is exact: the first pair that differs decides.
    while i < len(xs) and i < len(ys) and _ast_width(xs[i]) == _ast_width(ys[i]):
        if not _same_statement(xs[i], ys[i]):
            return False
        i += 1
    if i == len(xs) or i == len(ys):
        return i == len(xs) == len(ys)  # the longer list holds statements the other lacks
    # `a; b` against two lines (never produced by a patch): compare the rest as a whole.
    return syntax_key(module_of(xs[i:]).code) == syntax_key(module_of(ys[i:]).code)


def module_of(stmts: Sequence[Statement]) -> cst.Module:
    """A module holding `stmts` (a statement is a line or a compound statement; LibCST types the
    module body with those two)."""
    return cst.Module(body=cast("Sequence[cst.SimpleStatementLine | cst.BaseCompoundStatement]", stmts))


_PASS_BODY = cst.IndentedBlock(body=[cst.SimpleStatementLine(body=[cst.Pass()])])

_CLAUSES = (cst.If, cst.Else, cst.ExceptHandler, cst.ExceptStarHandler, cst.Finally, cst.MatchCase)


class _OneLineBlock(Exception):
    pass


def map_blocks(node: cst.CSTNode, fn: Callable[[cst.BaseSuite, cst.CSTNode], cst.BaseSuite]) -> cst.CSTNode:
    """`node` (a compound statement or clause) with each block of its own, its clauses' blocks
    included, replaced by `fn(block, owner)`; `node` itself when `fn` changed nothing."""
    changes: dict[str, object] = {}
    for name in ("body", "orelse", "handlers", "finalbody", "cases"):
        value = getattr(node, name, None)
        if isinstance(value, cst.BaseSuite):
            new: object = fn(value, node)
        elif isinstance(value, _CLAUSES):
            new = map_blocks(value, fn)
        elif name in ("handlers", "cases") and isinstance(value, Sequence):
            items = [map_blocks(clause, fn) for clause in value]
            new = value if all(a is b for a, b in zip(items, value)) else items
        else:
            continue
        if new is not value:
            changes[name] = new
    return node.with_changes(**changes) if changes else node


def _shell(node: cst.CSTNode, blocks: list[Sequence[Statement]]) -> cst.CSTNode:
    """`node` with each block of its own (its clauses' too) replaced by `pass`; the blocks'
    statements are appended to `blocks`, in order."""

    def collect(block: cst.BaseSuite, _: cst.CSTNode) -> cst.BaseSuite:
        if not isinstance(block, cst.IndentedBlock):
            raise _OneLineBlock  # `if x: y`: compared as a whole
        blocks.append(block.body)
        return _PASS_BODY

    return map_blocks(node, collect)


def _same_statement(a: Statement, b: Statement) -> bool:
    if a is b:
        return True
    if isinstance(a, cst.BaseCompoundStatement) and type(a) is type(b):
        # The header (decorators, signature, conditions, clauses) and then each block, statement
        # by statement: only what differs in identity is generated and parsed.
        blocks_a: list[Sequence[Statement]] = []
        blocks_b: list[Sequence[Statement]] = []
        try:
            shell_a, shell_b = _shell(a, blocks_a), _shell(b, blocks_b)
        except _OneLineBlock:
            return statement_key(a) == statement_key(b)
        return statement_key(shell_a) == statement_key(shell_b) and all(
            _same_body(x, y) for x, y in zip(blocks_a, blocks_b, strict=True)
        )
    return statement_key(a) == statement_key(b)


def defined_name(stmt: Statement) -> str | None:
    """The name a module-level `def`, `class` or single-target `name = ...` statement defines."""
    if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
        return stmt.name.value
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
        small = stmt.body[0]
        if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name):
            return small.targets[0].target.value
    return None


_DOCSTRING = m.SimpleStatementLine(body=[m.Expr(m.SimpleString() | m.ConcatenatedString())])


def is_docstring(stmt: Statement) -> bool:
    return m.matches(stmt, _DOCSTRING)


# `m.matches(stmt, m.ClassDef(name=m.Name(name)))`, without building a matcher per statement.
def is_class(stmt: cst.CSTNode, name: str) -> bool:
    return type(stmt) is cst.ClassDef and stmt.name.value == name


def is_def(stmt: cst.CSTNode, name: str) -> bool:
    return type(stmt) is cst.FunctionDef and stmt.name.value == name


def without_docstring(body: Sequence[Statement]) -> Sequence[Statement]:
    return body[1:] if body and is_docstring(body[0]) else body


@functools.lru_cache(maxsize=1024)  # the same payload method gives the same node: compared by identity
def as_statement(node: cst.CSTNode) -> Statement:
    assert isinstance(node, cst.BaseStatement), node
    return node


def bound_name(alias: cst.ImportAlias) -> str:
    """The name an import binds (`import a.b` binds `a.b`'s first part; `as x` binds x)."""
    name = cst.helpers.get_full_name_for_node(alias.asname.name if alias.asname else alias.name)
    assert name is not None
    return name


def with_blank_line(fn: cst.CSTNode) -> cst.CSTNode:
    if isinstance(fn, cst.FunctionDef) and not any(not line.comment for line in fn.leading_lines[:1]):
        return fn.with_changes(leading_lines=[cst.EmptyLine(indent=False), *fn.leading_lines])
    return fn


@functools.lru_cache(maxsize=1024)
def with_two_blank_lines(stmt: cst.CSTNode) -> cst.CSTNode:
    """A module-level statement as PEP 8 places it: two blank lines before it (and its comments)."""
    lines = [line for line in stmt.leading_lines if line.comment]  # type: ignore[attr-defined]
    return stmt.with_changes(leading_lines=[cst.EmptyLine(indent=False)] * 2 + lines)


class Substitute(cst.CSTTransformer):
    def __init__(self, names: dict[str, cst.BaseExpression]) -> None:
        self.names = names

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        return self.names.get(updated_node.value, updated_node)
