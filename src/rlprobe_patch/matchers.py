"""The part of `libcst.matchers` the codemods use, with its semantics, at a fraction of its cost.

Importing `libcst.matchers` takes about 0.12 s (it defines a dataclass for every node type),
as long as importing LibCST itself: a fifth of a whole `apply`. Its `findall` also rebuilds
every node it walks (a LibCST visitor does). This module keeps the spelling (`m.Call(func=...,
args=[m.Arg(...), m.ZeroOrMore()])`, `|`, `m.matches`, `m.findall`, `m.replace`) and the
rules of `libcst.matchers`:

- a node matcher matches a node of the same class name whose fields match the fields given
  (positional arguments are the node's fields in order; a field not given matches anything);
- a string or a bool matches an equal value, `None` matches `None`, `DoNotCare()` anything;
- a list matches a sequence item by item, `ZeroOrMore()` any run of items;
- `a | b` matches what either matches;
- `findall` lists the matching nodes of a tree, the root included (in field order, where
  LibCST lists them in source order: no caller depends on the order of several matches);
- `replace` rebuilds the tree, each matching node replaced by `fn(node, {})`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import ClassVar, TypeAlias, cast

import libcst as cst


class _DoNotCare:
    def __repr__(self) -> str:
        return "DoNotCare()"


_ANY = _DoNotCare()


def DoNotCare() -> _DoNotCare:
    return _ANY


class BaseMatcherNode:
    """A matcher of one node."""

    def __or__(self, other: BaseMatcherNode) -> OneOf:
        return OneOf(self, other)

    def _match(self, node: object) -> bool:
        raise NotImplementedError


class OneOf(BaseMatcherNode):
    """Matches what any of its options matches."""

    def __init__(self, *options: BaseMatcherNode) -> None:
        self.options: tuple[BaseMatcherNode, ...] = tuple(
            o for option in options for o in (option.options if isinstance(option, OneOf) else (option,))
        )

    def _match(self, node: object) -> bool:
        return any(option._match(node) for option in self.options)


class AtLeastN:
    """In a list: `n` or more items in a row, each matching `matcher`."""

    def __init__(self, matcher: Field = _ANY, *, n: int = 0) -> None:
        self.matcher = matcher
        self.n = n


def ZeroOrMore(matcher: Field = _ANY) -> AtLeastN:
    return AtLeastN(matcher, n=0)


Field: TypeAlias = "BaseMatcherNode | _DoNotCare | str | bool | Sequence[Field | AtLeastN] | None"

_FIELDS: dict[type[cst.CSTNode], tuple[str, ...]] = {}


def _field_names(node_type: type[cst.CSTNode]) -> tuple[str, ...]:
    names = _FIELDS.get(node_type)
    if names is None:
        names = _FIELDS[node_type] = tuple(f.name for f in dataclasses.fields(node_type))
    return names


class _Node(BaseMatcherNode):
    NODE: ClassVar[type[cst.CSTNode]]

    def __init__(self, *args: Field, **kwargs: Field) -> None:
        names = _field_names(self.NODE)
        if len(args) > len(names):
            raise TypeError(f"{type(self).__name__}: {len(args)} positional fields, the node has {len(names)}")
        given = dict(zip(names, args))
        for name, value in kwargs.items():
            if name not in names or name in given:
                raise TypeError(f"{type(self).__name__}: unexpected or repeated field {name!r}")
            given[name] = value
        self.fields = tuple((k, v) for k, v in given.items() if v is not _ANY)

    def _match(self, node: object) -> bool:
        return type(node).__name__ == self.NODE.__name__ and all(
            _field_matches(getattr(node, name), want) for name, want in self.fields
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.fields)})"


def _field_matches(value: object, want: Field | AtLeastN) -> bool:
    if want is _ANY:
        return True
    if want is None:
        return value is None
    if isinstance(want, bool):
        return value is want
    if isinstance(want, str):
        return value == want
    if isinstance(want, BaseMatcherNode):
        return isinstance(value, cst.CSTNode) and want._match(value)
    if isinstance(want, Sequence) and isinstance(value, Sequence) and not isinstance(value, str):
        return _sequence_matches(value, want)
    return False


def _sequence_matches(values: Sequence[object], wants: Sequence[Field | AtLeastN]) -> bool:
    if not wants:
        return not values
    want, rest = wants[0], wants[1:]
    if isinstance(want, AtLeastN):
        if want.n > 0:
            return (
                bool(values)
                and _field_matches(values[0], want.matcher)
                and (_sequence_matches(values[1:], [AtLeastN(want.matcher, n=want.n - 1), *rest]))
            )
        # Greedy first, as libcst.matchers: consume one item and stay, else leave the wildcard.
        if values and _field_matches(values[0], want.matcher) and _sequence_matches(values[1:], wants):
            return True
        return _sequence_matches(values, rest)
    return bool(values) and _field_matches(values[0], want) and _sequence_matches(values[1:], rest)


def matches(node: object, matcher: BaseMatcherNode) -> bool:
    """Whether `node` matches `matcher` (a sentinel never does)."""
    return isinstance(node, cst.CSTNode) and matcher._match(node)


# Whitespace, comments and newlines hold no node a matcher of this module can name.
_LEAVES = (cst.BaseParenthesizableWhitespace, cst.EmptyLine, cst.TrailingWhitespace, cst.Newline, cst.Comment)
_SKIP, _LEAF, _WALK = 0, 1, 2
_KINDS: dict[type, int] = {list: _SKIP, tuple: _SKIP}  # lists and tuples are walked item by item


def _kind(value_type: type) -> int:
    """_SKIP (not a node), _LEAF (a node that holds nothing to find) or _WALK; one `issubclass` per
    class (LibCST's base classes are ABCs: `isinstance` on them is slow)."""
    kind = _KINDS.get(value_type)
    if kind is None:
        if not issubclass(value_type, cst.CSTNode):
            kind = _SKIP
        else:
            kind = _LEAF if issubclass(value_type, _LEAVES) else _WALK
        _KINDS[value_type] = kind
    return kind


def findall(tree: object, matcher: BaseMatcherNode) -> list[cst.CSTNode]:
    """Every node of `tree` (itself included) that matches `matcher`."""
    found: list[cst.CSTNode] = []
    stack: list[object] = [tree]
    while stack:
        node = stack.pop()
        node_type = type(node)
        kind = _KINDS.get(node_type)
        if kind is None:
            kind = _kind(node_type)
        if kind != _WALK:
            continue
        cst_node = cast("cst.CSTNode", node)  # _kind said so
        if matcher._match(cst_node):
            found.append(cst_node)
        children: list[object] = []
        for name in _field_names(type(cst_node)):
            value = getattr(node, name)
            if type(value) in (list, tuple):
                children.extend(value)
            else:
                children.append(value)
        stack.extend(reversed(children))
    return found


class _Replace(cst.CSTTransformer):
    def __init__(self, matcher: BaseMatcherNode, fn: Callable[[cst.CSTNode, dict[str, object]], cst.CSTNode]) -> None:
        super().__init__()
        self.matcher = matcher
        self.fn = fn

    def on_leave(  # type: ignore[override]
        self, original_node: cst.CSTNode, updated_node: cst.CSTNode
    ) -> cst.CSTNode:
        return self.fn(updated_node, {}) if self.matcher._match(original_node) else updated_node


def replace(
    tree: cst.CSTNode, matcher: BaseMatcherNode, fn: Callable[[cst.CSTNode, dict[str, object]], cst.CSTNode]
) -> cst.CSTNode:
    """A new tree: `tree` with every node that matches `matcher` (matched before its children
    are replaced) replaced by `fn(updated node, {})`."""
    new = tree.visit(_Replace(matcher, fn))
    assert isinstance(new, cst.CSTNode)
    return new


# The node matchers the codemods use (add one here when a codemod needs another node type).
class Name(_Node):
    NODE = cst.Name


class Attribute(_Node):
    NODE = cst.Attribute


class Call(_Node):
    NODE = cst.Call


class Arg(_Node):
    NODE = cst.Arg


class Await(_Node):
    NODE = cst.Await


class SimpleString(_Node):
    NODE = cst.SimpleString


class ConcatenatedString(_Node):
    NODE = cst.ConcatenatedString


class Tuple(_Node):
    NODE = cst.Tuple


class Element(_Node):
    NODE = cst.Element


class Dict(_Node):
    NODE = cst.Dict


class Subscript(_Node):
    NODE = cst.Subscript


class SubscriptElement(_Node):
    NODE = cst.SubscriptElement


class Index(_Node):
    NODE = cst.Index


class SimpleStatementLine(_Node):
    NODE = cst.SimpleStatementLine


class Expr(_Node):
    NODE = cst.Expr


class Assign(_Node):
    NODE = cst.Assign


class AssignTarget(_Node):
    NODE = cst.AssignTarget


class AnnAssign(_Node):
    NODE = cst.AnnAssign


class AugAssign(_Node):
    NODE = cst.AugAssign


class Return(_Node):
    NODE = cst.Return


class FunctionDef(_Node):
    NODE = cst.FunctionDef


class ClassDef(_Node):
    NODE = cst.ClassDef


class For(_Node):
    NODE = cst.For


class With(_Node):
    NODE = cst.With


class WithItem(_Node):
    NODE = cst.WithItem
