"""The blocks of one method an operation edits (`BlockEditor`), and what a `Hook` and a `HoistKeyword` do there:
one small function per place (the start or the end of a block, before or after each anchor), each inserting or,
with `strip`, taking out exactly what it inserts."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar, cast

import libcst as cst
import libcst.matchers as m

from rlprobe_patch.codemod._anchors import findall
from rlprobe_patch.codemod._operations import ANY, METHOD, HoistKeyword, Hook, Statement, StatementPredicate, Where
from rlprobe_patch.codemod._syntax import Substitute, as_statement, is_docstring, map_blocks, statement_key

Owner = TypeVar("Owner", cst.Module, cst.ClassDef)

Node = TypeVar("Node", cst.ClassDef, cst.FunctionDef)


class BlockEditor:
    """Calls `edit(statements, is_method_body)` on the blocks of one method that `block` selects.

    It walks statements only (never expressions, never nested functions or classes), innermost
    blocks first, and keeps every node it did not edit as the same object."""

    def __init__(
        self,
        root: cst.FunctionDef,
        block: str | StatementPredicate,
        edit: Callable[[list[Statement], bool], list[Statement]],
    ) -> None:
        self.root = root
        self.block = block
        self.edit = edit
        self.blocks_matched = 0

    def run(self) -> cst.FunctionDef:
        return map_blocks(self.root, self._block)  # type: ignore[return-value]

    def _block(self, block: cst.BaseSuite, owner: cst.CSTNode) -> cst.BaseSuite:
        if not isinstance(block, cst.IndentedBlock):
            return block  # a one-line block (`if x: y`) holds no anchors of ours
        stmts: list[Statement] = [
            as_statement(map_blocks(s, self._block)) if holds_method_blocks(s) else s for s in block.body
        ]
        changed = any(a is not b for a, b in zip(stmts, block.body))
        if self._selected(block, owner):
            self.blocks_matched += 1
            new = self.edit(list(stmts), block is self.root.body)
            if len(new) != len(stmts) or any(a is not b for a, b in zip(new, stmts)):
                stmts, changed = new, True
        return block.with_changes(body=stmts) if changed else block

    def _selected(self, block: cst.BaseSuite, owner: cst.CSTNode) -> bool:
        if block is self.root.body:
            return self.block in (METHOD, ANY)
        if self.block == METHOD:
            return False
        if self.block == ANY:
            return True
        return isinstance(owner, cst.BaseStatement) and self.block(owner)  # type: ignore[operator]


def holds_method_blocks(stmt: Statement) -> bool:
    """A compound statement, but not a nested scope (its blocks are not the method's)."""
    return isinstance(stmt, cst.BaseCompoundStatement) and not isinstance(stmt, (cst.FunctionDef, cst.ClassDef))


def replaced(owner: Owner, body: Sequence[Statement], index: int, edit: Callable[[Node], Node]) -> Owner:
    """`owner` with statement `index` of its body edited; `owner` itself when the edit changed nothing."""
    old = body[index]
    new = edit(old)  # type: ignore[arg-type]
    if new is old:
        return owner
    items = [*body[:index], new, *body[index + 1 :]]
    if isinstance(owner, cst.Module):
        return owner.with_changes(body=items)
    return owner.with_changes(body=owner.body.with_changes(body=items))


def _matches_at(stmts: list[Statement], start: int, ours: list[Statement]) -> bool:
    """Whether `ours` stands at `start` of `stmts`, statement by statement (by their syntax)."""
    window = stmts[start : start + len(ours)]
    return (
        start >= 0
        and len(window) == len(ours)
        and all(statement_key(a) == statement_key(b) for a, b in zip(window, ours))
    )


@dataclass
class HookEdit:
    """One `Hook` on the blocks of a method (`BlockEditor`'s edit): its payload statements inserted at its place, or
    with `strip` taken out; `anchors` counts the anchor statements met (none, or several without `many`, is
    refused by the caller)."""

    op: Hook
    payload: list[Statement]  # the payload function's statements, parameters baked in
    strip: bool
    anchors: int = 0

    def ours(self, anchor: Statement | None) -> list[Statement]:
        """The statements inserted at `anchor` (the template's names taken from it)."""
        if self.op.template is None or anchor is None:
            return self.payload
        names = self.op.template(anchor)
        return [cast(Statement, s.visit(Substitute(names))) for s in self.payload]

    def is_anchor(self, stmt: Statement) -> bool:
        assert self.op.anchor is not None
        if not self.op.anchor(stmt):
            return False
        self.anchors += 1
        return True

    def __call__(self, stmts: list[Statement], is_method_body: bool) -> list[Statement]:
        return _PLACES[self.op.where](self, stmts, is_method_body)


def _at_start(edit: HookEdit, stmts: list[Statement], is_method_body: bool) -> list[Statement]:
    """The first statements of the block, after a method's docstring."""
    ours = edit.ours(None)
    at = 1 if is_method_body and stmts and is_docstring(stmts[0]) else 0
    if edit.strip:
        return stmts[:at] + stmts[at + len(ours) :] if _matches_at(stmts, at, ours) else stmts
    return stmts[:at] + ours + stmts[at:]


def _at_end(edit: HookEdit, stmts: list[Statement], is_method_body: bool) -> list[Statement]:
    """The last statements of the block."""
    ours = edit.ours(None)
    if edit.strip:
        at = len(stmts) - len(ours)
        return stmts[:at] if _matches_at(stmts, at, ours) else stmts
    return stmts + ours


def _before_anchors(edit: HookEdit, stmts: list[Statement], is_method_body: bool) -> list[Statement]:
    """Right before each anchor statement."""
    out: list[Statement] = []
    for stmt in stmts:
        if edit.is_anchor(stmt):
            ours = edit.ours(stmt)
            if not edit.strip:
                out += ours
            elif len(out) >= len(ours) and _matches_at(out, len(out) - len(ours), ours):
                del out[len(out) - len(ours) :]
        out.append(stmt)
    return out


def _after_anchors(edit: HookEdit, stmts: list[Statement], is_method_body: bool) -> list[Statement]:
    """Right after each anchor statement."""
    out: list[Statement] = []
    i = 0
    while i < len(stmts):
        stmt = stmts[i]
        out.append(stmt)
        i += 1
        if not edit.is_anchor(stmt):
            continue
        ours = edit.ours(stmt)
        if not edit.strip:
            out += ours
        elif _matches_at(stmts, i, ours):
            i += len(ours)
    return out


_PLACES: dict[Where, Callable[[HookEdit, list[Statement], bool], list[Statement]]] = {
    Where.START: _at_start,
    Where.END: _at_end,
    Where.BEFORE: _before_anchors,
    Where.AFTER: _after_anchors,
}


@dataclass
class HoistEdit:
    """One `HoistKeyword` on the blocks of a method: `f(keyword=EXPR)` becomes `name = EXPR` and `f(keyword=name)`,
    or with `strip` back; `found` counts the calls met (exactly one is wanted)."""

    op: HoistKeyword
    strip: bool
    found: int = 0

    def keyword_of(self, stmt: Statement) -> cst.Arg | None:
        """The `keyword=` argument of the one call `op.call` matches in `stmt`, if that is what `stmt` holds."""
        if not isinstance(stmt, cst.SimpleStatementLine):
            return None
        calls = findall(stmt, self.op.call)
        args = [
            a
            for c in calls
            for a in cst.ensure_type(c, cst.Call).args
            if a.keyword is not None and a.keyword.value == self.op.keyword
        ]
        return args[0] if len(calls) == 1 and len(args) == 1 else None

    def __call__(self, stmts: list[Statement], is_method_body: bool) -> list[Statement]:
        out: list[Statement] = []
        for stmt in stmts:
            arg = self.keyword_of(stmt)
            if arg is None:
                out.append(stmt)
                continue
            self.found += 1
            out += self._unhoisted(out, stmt, arg) if self.strip else self._hoisted(stmt, arg)
        return out

    def _hoisted(self, stmt: Statement, arg: cst.Arg) -> list[Statement]:
        template = cst.parse_statement(f"{self.op.name} = _  # rlprobe-patch")
        hoisted = cast(Statement, template.visit(Substitute({"_": arg.value})))
        named = stmt.deep_replace(arg, arg.with_changes(value=cst.Name(self.op.name)))
        return [hoisted, as_statement(named)]

    def _unhoisted(self, out: list[Statement], stmt: Statement, arg: cst.Arg) -> list[Statement]:
        """`stmt` with the value put back from the assignment before it (taken off `out`), where it is ours."""
        prev = out[-1] if out else None
        pattern = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(m.Name(self.op.name))])])
        if m.matches(arg.value, m.Name(self.op.name)) and prev is not None and m.matches(prev, pattern):
            out.pop()
            assignment = cst.ensure_type(prev, cst.SimpleStatementLine).body[0]
            value = cst.ensure_type(assignment, cst.Assign).value
            stmt = as_statement(stmt.deep_replace(arg, arg.with_changes(value=value)))
        return [stmt]
