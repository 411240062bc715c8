"""Finding nodes (`findall`, `contains`) and the anchor matchers patches share (`self_call`, `assigns_call`,
`returns_tuple`, `first_returned`).

`m.findall` walks a tree with a LibCST visitor, which rebuilds every node it passes (and the visitor's `isinstance`
checks against LibCST's ABCs are slow): it was the larger part of planning. `findall` here walks the nodes' fields
instead and asks `libcst.matchers.matches` about each node, so what matches is libcst.matchers' answer; only the walk
is ours. It does not descend into whitespace, comments and newlines (no anchor names them), and it lists the matches
in pre-order of the nodes' fields, not in source order."""

from __future__ import annotations

import dataclasses
from typing import cast

import libcst as cst
import libcst.matchers as m

from rlprobe_patch.codemod._operations import Statement, StatementPredicate

# `m.findall` walks a tree with a LibCST visitor, which rebuilds every node it passes (and the
# visitor's `isinstance` checks against LibCST's ABCs are slow): it was the larger part of
# planning. `findall` below walks the nodes' fields instead and asks `libcst.matchers.matches`
# about each node, so what matches is libcst.matchers' answer; only the walk is ours. It does not
# descend into whitespace, comments and newlines (no anchor names them), and it lists the
# matches in pre-order of the nodes' fields, not in source order.
_NOT_SEARCHED = (cst.BaseParenthesizableWhitespace, cst.EmptyLine, cst.TrailingWhitespace, cst.Newline, cst.Comment)

_FIELDS: dict[type, tuple[str, ...] | None] = {}  # per class: the fields to walk, None for a class not walked


def _fields_to_walk(node_type: type) -> tuple[str, ...] | None:
    if node_type not in _FIELDS:  # one `issubclass` per class: on LibCST's ABCs, `isinstance` is slow
        walked = issubclass(node_type, cst.CSTNode) and not issubclass(node_type, _NOT_SEARCHED)
        _FIELDS[node_type] = tuple(f.name for f in dataclasses.fields(node_type)) if walked else None
    return _FIELDS[node_type]


def findall(tree: cst.CSTNode, matcher: m.BaseMatcherNode) -> list[cst.CSTNode]:
    """The nodes of `tree` (itself included) that `matcher` matches, as `libcst.matchers.matches` says."""
    found: list[cst.CSTNode] = []
    stack: list[object] = [tree]
    while stack:
        node = cast("cst.CSTNode", stack.pop())  # or a value that is no node: `names` is None then
        node_type = type(node)
        names = _FIELDS[node_type] if node_type in _FIELDS else _fields_to_walk(node_type)
        if names is None:
            continue
        if m.matches(node, matcher):
            found.append(node)
        children: list[object] = []
        for name in names:
            value = getattr(node, name)
            if type(value) in (list, tuple):
                children.extend(value)
            else:
                children.append(value)
        stack.extend(reversed(children))
    return found


def self_call(method: str) -> m.Call:
    """Matcher for a call `self.<method>(...)`."""
    return m.Call(func=m.Attribute(value=m.Name("self"), attr=m.Name(method)))


def contains(node: cst.CSTNode, matcher: m.BaseMatcherNode) -> bool:
    return bool(findall(node, matcher))


def assigns_call(target: str | None, call: m.Call | m.OneOf[m.Call]) -> StatementPredicate:
    """`target = <call>` or `target: T = <call>` as a statement line (any one name when `target` is None)."""
    name = m.Name() if target is None else m.Name(target)
    pattern = m.SimpleStatementLine(
        body=[m.Assign(targets=[m.AssignTarget(name)], value=call) | m.AnnAssign(target=name, value=call)]
    )
    return lambda stmt: m.matches(stmt, pattern)


def returns_tuple(min_elements: int = 2) -> StatementPredicate:
    """`return a, b[, ...]` as a statement line."""

    def predicate(stmt: Statement) -> bool:
        if not m.matches(stmt, m.SimpleStatementLine(body=[m.Return(value=m.Tuple())])):
            return False
        value = stmt.body[0].value  # type: ignore[attr-defined]
        return len(value.elements) >= min_elements

    return predicate


def first_returned(stmt: Statement) -> cst.BaseExpression:
    returned = cst.ensure_type(cst.ensure_type(stmt, cst.SimpleStatementLine).body[0], cst.Return).value
    return cst.ensure_type(returned, cst.Tuple).elements[0].value
