"""The codemod toolkit every patch in `patches/` is written with.

A patch's codemod is a declaration: the payload file (real Python whose methods and
statement hooks are inserted verbatim) plus a list of operations, each anchored on syntax
(class, method, the shape of a statement). From that one declaration this module derives:

- `insert`: put the payload in (raises `AnchorError` naming the class/method and what was
  expected when an anchor is missing or ambiguous);
- `strip`: take exactly our payload out again (recognised by its syntax tree, so a
  reformatted file is still recognised);
- `state`: APPLIED / APPLICABLE / DRIFTED, decided as
  APPLIED    when insert(strip(tree)) has the same syntax tree as the tree,
  APPLICABLE when strip finds nothing of ours and every anchor is found once,
  DRIFTED    otherwise (anchors missing or ambiguous, hooks edited or only partly there).
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import functools
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, TypeVar, cast

import libcst as cst
import libcst.helpers
import libcst.matchers as m

from rlprobe_patch.codemod._partial_parse import Scope
from rlprobe_patch.codemod._payload_parts import assemble

Statement = cst.BaseStatement
StatementPredicate = Callable[[Statement], bool]


class AnchorError(Exception):
    """A structural anchor is missing or ambiguous: the patch cannot be placed safely."""

    def __init__(self, scope: str, expected: str, found: str) -> None:
        self.scope = scope
        self.expected = expected
        self.found = found
        super().__init__(f"{scope}: expected {expected}; found {found}")


class State(str, enum.Enum):
    APPLIED = "applied"
    APPLICABLE = "applicable"
    DRIFTED = "drifted"


@dataclass(frozen=True)
class StateReport:
    state: State
    reasons: tuple[str, ...] = ()
    params: dict[str, str] = field(default_factory=dict)
    # The tree as this patch wants it (insert(strip(tree))); None when an anchor failed.
    expected: cst.Module | None = field(default=None, compare=False, repr=False)


class Where(str, enum.Enum):
    START = "start"  # first statements of the block (after a method's docstring)
    END = "end"  # last statements of the block
    BEFORE = "before"  # immediately before each anchor statement
    AFTER = "after"  # immediately after each anchor statement


METHOD = "method"  # the method's own body
ANY = "any"  # every block inside the method (nested functions and classes excluded)


@dataclass(frozen=True)
class Hook:
    """Insert the body of the payload function `payload` into `cls.method`.

    `block` picks the statement blocks searched: METHOD, ANY, or a predicate on the compound
    statement that owns the block (for example the `for` loop over micro-batches).
    `anchor` picks statements inside those blocks for BEFORE/AFTER.
    `template` maps names used in the payload to expressions taken from the anchor.
    `parameters` names the method's parameters the payload reads: a method without one is refused.
    """

    cls: str | None  # None: a module-level function named `method`
    method: str
    payload: str
    where: Where
    block: str | StatementPredicate = METHOD
    anchor: StatementPredicate | None = None
    expected: str = ""  # how the anchor is described to users
    many: bool = False  # the anchor may (and must at least once) match several times
    template: Callable[[Statement], dict[str, cst.BaseExpression]] | None = None
    inner: str | None = None  # the hook goes into the function of this name defined (once) inside the method
    parameters: tuple[str, ...] = ()  # parameters of the method the payload reads (refused where one is missing)


@dataclass(frozen=True)
class AddMethods:
    """Add every method of the payload class `payload_cls` (default: `cls`) to the class `cls`."""

    cls: str
    payload_cls: str | None = None


@dataclass(frozen=True)
class HoistKeyword:
    """Name the value of `keyword=` in the one call of `cls.method` that `call` matches.

    `f(keyword=EXPR)` becomes `name = EXPR` followed by `f(keyword=name)`, so that hooks after
    the call can use the value (for example the request id a rollout server was sent).
    """

    cls: str | None
    method: str
    call: m.BaseMatcherNode
    keyword: str
    name: str
    expected: str = ""


@dataclass(frozen=True)
class AddDefinitions:
    """Append the payload's module-level definitions named `names` (functions, classes, `name = ...`
    assignments) to the end of the target module, in the payload's order.

    For targets whose hooks live in module-level functions, with no class to add methods to."""

    names: tuple[str, ...]


Operation = Hook | AddMethods | HoistKeyword | AddDefinitions
_Owner = TypeVar("_Owner", cst.Module, cst.ClassDef)
_Node = TypeVar("_Node", cst.ClassDef, cst.FunctionDef)


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


def _map_blocks(node: cst.CSTNode, fn: Callable[[cst.BaseSuite, cst.CSTNode], cst.BaseSuite]) -> cst.CSTNode:
    """`node` (a compound statement or clause) with each block of its own, its clauses' blocks
    included, replaced by `fn(block, owner)`; `node` itself when `fn` changed nothing."""
    changes: dict[str, object] = {}
    for name in ("body", "orelse", "handlers", "finalbody", "cases"):
        value = getattr(node, name, None)
        if isinstance(value, cst.BaseSuite):
            new: object = fn(value, node)
        elif isinstance(value, _CLAUSES):
            new = _map_blocks(value, fn)
        elif name in ("handlers", "cases") and isinstance(value, Sequence):
            items = [_map_blocks(clause, fn) for clause in value]
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

    return _map_blocks(node, collect)


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
            if _is_class(stmt, cls):
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
            if _is_def(stmt, hook):
                assert isinstance(stmt, cst.FunctionDef) and isinstance(stmt.body, cst.IndentedBlock)
                return list(_without_docstring(stmt.body.body))
        raise KeyError(f"{self.path}: no statement hook {hook}")


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


def _is_docstring(stmt: Statement) -> bool:
    return m.matches(stmt, _DOCSTRING)


# `m.matches(stmt, m.ClassDef(name=m.Name(name)))`, without building a matcher per statement.
def _is_class(stmt: cst.CSTNode, name: str) -> bool:
    return type(stmt) is cst.ClassDef and stmt.name.value == name


def _is_def(stmt: cst.CSTNode, name: str) -> bool:
    return type(stmt) is cst.FunctionDef and stmt.name.value == name


def _without_docstring(body: Sequence[Statement]) -> Sequence[Statement]:
    return body[1:] if body and _is_docstring(body[0]) else body


def _scope_name(op: Hook | HoistKeyword) -> str:
    name = f"{op.cls}.{op.method}" if op.cls else op.method
    inner = getattr(op, "inner", None)
    return f"{name}.<locals>.{inner}" if inner else name


@functools.lru_cache(maxsize=1024)  # the same payload method gives the same node: compared by identity
def _statement(node: cst.CSTNode) -> Statement:
    assert isinstance(node, cst.BaseStatement), node
    return node


def _bound_name(alias: cst.ImportAlias) -> str:
    """The name an import binds (`import a.b` binds `a.b`'s first part; `as x` binds x)."""
    name = cst.helpers.get_full_name_for_node(alias.asname.name if alias.asname else alias.name)
    assert name is not None
    return name


def _with_blank_line(fn: cst.CSTNode) -> cst.CSTNode:
    if isinstance(fn, cst.FunctionDef) and not any(not line.comment for line in fn.leading_lines[:1]):
        return fn.with_changes(leading_lines=[cst.EmptyLine(indent=False), *fn.leading_lines])
    return fn


@functools.lru_cache(maxsize=1024)
def _with_two_blank_lines(stmt: cst.CSTNode) -> cst.CSTNode:
    """A module-level statement as PEP 8 places it: two blank lines before it (and its comments)."""
    lines = [line for line in stmt.leading_lines if line.comment]  # type: ignore[attr-defined]
    return stmt.with_changes(leading_lines=[cst.EmptyLine(indent=False)] * 2 + lines)


class _Substitute(cst.CSTTransformer):
    def __init__(self, names: dict[str, cst.BaseExpression]) -> None:
        self.names = names

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        return self.names.get(updated_node.value, updated_node)


class _BlockEditor:
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
        return _map_blocks(self.root, self._block)  # type: ignore[return-value]

    def _block(self, block: cst.BaseSuite, owner: cst.CSTNode) -> cst.BaseSuite:
        if not isinstance(block, cst.IndentedBlock):
            return block  # a one-line block (`if x: y`) holds no anchors of ours
        stmts: list[Statement] = [
            _statement(_map_blocks(s, self._block)) if _holds_method_blocks(s) else s for s in block.body
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


def _holds_method_blocks(stmt: Statement) -> bool:
    """A compound statement, but not a nested scope (its blocks are not the method's)."""
    return isinstance(stmt, cst.BaseCompoundStatement) and not isinstance(stmt, (cst.FunctionDef, cst.ClassDef))


def _replaced(owner: _Owner, body: Sequence[Statement], index: int, edit: Callable[[_Node], _Node]) -> _Owner:
    """`owner` with statement `index` of its body edited; `owner` itself when the edit changed nothing."""
    old = body[index]
    new = edit(old)  # type: ignore[arg-type]
    if new is old:
        return owner
    items = [*body[:index], new, *body[index + 1 :]]
    if isinstance(owner, cst.Module):
        return owner.with_changes(body=items)
    return owner.with_changes(body=owner.body.with_changes(body=items))


class PatchCodemod:
    """Base class of every patch's codemod (`patches/<id>/codemod.py`)."""

    DESCRIPTION: ClassVar[str] = ""
    OPERATIONS: ClassVar[Sequence[Operation]] = ()
    # Module-level names the payload relies on (they are checked, never added).
    REQUIRES_MODULE_NAMES: ClassVar[Sequence[str]] = ()
    # Default values of the apply-time parameters (see `read_params`).
    PARAMS: ClassVar[dict[str, str]] = {}

    def __init__(self, payload: Payload, target: str) -> None:
        self.payload = payload
        self.target = target

    # -- parameters baked into inserted code ------------------------------------------------
    def bake(self, stmt: cst.CSTNode, params: dict[str, str]) -> cst.CSTNode:
        """Return the payload node with apply-time parameters filled in (default: unchanged)."""
        return stmt

    def read_params(self, module: cst.Module) -> dict[str, str]:
        """Read the parameters an already patched tree was baked with."""
        return dict(self.PARAMS)

    def scope(self) -> Scope:
        """What `insert`, `strip`, `state` and `read_params` read of a file (besides its module-level
        statement lines): the methods and functions the operations name, and the payload's own
        methods and definitions where it adds them. The rest of the file is never looked at."""
        names: set[str] = set()
        methods: dict[str, set[str]] = {}
        for op in self.OPERATIONS:
            if isinstance(op, AddDefinitions):
                names.update(op.names)
            elif isinstance(op, AddMethods):
                ours = self.payload.methods(op.payload_cls or op.cls)
                methods.setdefault(op.cls, set()).update(fn.name.value for fn in ours)
            elif op.cls is None:
                names.add(op.method)
            else:
                methods.setdefault(op.cls, set()).add(op.method)
        return Scope(frozenset(names), {cls: frozenset(found) for cls, found in methods.items()})

    # -- the three derived operations -----------------------------------------------------
    def insert(self, module: cst.Module, params: dict[str, str] | None = None) -> cst.Module:
        params = {**self.PARAMS, **(params or {})}
        self._check_module_names(module)
        for op in self.OPERATIONS:
            module = self._apply(module, op, params, strip=False)
        return module

    def strip(self, module: cst.Module, params: dict[str, str] | None = None) -> cst.Module:
        """`module` without our payload; `params`: what `read_params` says of it (read when not given)."""
        params = self.read_params(module) if params is None else params
        for op in reversed(self.OPERATIONS):
            try:
                module = self._apply(module, op, params, strip=True)
            except AnchorError:
                continue  # nothing of ours can sit at an anchor that is not there
        return module

    def state(self, module: cst.Module) -> StateReport:
        params = self.read_params(module)
        stripped = self.strip(module, params)
        ours_present = not same_syntax(stripped, module)
        try:
            expected = self.insert(stripped, params)
        except AnchorError as exc:
            why = str(exc)
            if ours_present:
                why += " (the file also holds parts of this patch)"
            return StateReport(State.DRIFTED, (why,), params)
        if same_syntax(expected, module):
            return StateReport(State.APPLIED, (), params, expected)
        if not ours_present:
            return StateReport(State.APPLICABLE, (), params, expected)
        return StateReport(
            State.DRIFTED,
            (
                "hooks of this patch are in the file but not as rlprobe-patch inserts them: only partly there, "
                "edited after apply, or added by hand (e.g. from the skill's instructions); not patching twice",
            ),
            params,
            expected,
        )

    # -- machinery --------------------------------------------------------------------------
    def _check_module_names(self, module: cst.Module) -> None:
        defined: set[str] = set()
        for line in module.body:
            for small in line.body if isinstance(line, cst.SimpleStatementLine) else ():
                if isinstance(small, cst.Import):
                    defined.update(_bound_name(a).split(".")[0] for a in small.names)
                elif isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
                    defined.update(_bound_name(a) for a in small.names)
                elif isinstance(small, (cst.Assign, cst.AnnAssign)):
                    targets = small.targets if isinstance(small, cst.Assign) else [small]
                    defined.update(t.target.value for t in targets if isinstance(t.target, cst.Name))
        missing = [name for name in self.REQUIRES_MODULE_NAMES if name not in defined]
        if missing:
            raise AnchorError(
                f"{self.target} (module level)",
                "the names " + ", ".join(f"`{n}`" for n in self.REQUIRES_MODULE_NAMES) + " defined at module level",
                "no " + ", ".join(f"`{n}`" for n in missing),
            )

    def _apply(self, module: cst.Module, op: Operation, params: dict[str, str], strip: bool) -> cst.Module:
        if isinstance(op, AddDefinitions):
            return self._add_definitions(module, op, params, strip)
        if isinstance(op, AddMethods):
            return self._edit_class(module, op.cls, lambda cls: self._add_methods(cls, op, params, strip))
        edit: Callable[[cst.FunctionDef], cst.FunctionDef] = (
            (lambda fn: self._hoist(fn, op, strip))
            if isinstance(op, HoistKeyword)
            else (lambda fn: self._hook(fn, op, params, strip))
        )
        if isinstance(op, Hook) and op.inner:
            edit = self._in_nested_function(op, edit)
        if op.cls is None:
            return self._edit_function(module, op.method, edit)
        return self._edit_class(module, op.cls, lambda cls: self._edit_method(cls, op.method, edit))

    def _in_nested_function(
        self, op: Hook, edit: Callable[[cst.FunctionDef], cst.FunctionDef]
    ) -> Callable[[cst.FunctionDef], cst.FunctionDef]:
        """Apply `edit` to the one function named `op.inner` defined inside the method."""

        inner_name = op.inner
        assert inner_name is not None

        def edit_outer(outer: cst.FunctionDef) -> cst.FunctionDef:
            found = findall(outer.body, m.FunctionDef(name=m.Name(inner_name)))
            if len(found) != 1:
                raise AnchorError(
                    f"{self.target}: {_scope_name(op)}", f"one nested function `{op.inner}`", f"{len(found)}"
                )
            inner = found[0]
            assert isinstance(inner, cst.FunctionDef)
            return cst.ensure_type(outer.deep_replace(inner, edit(inner)), cst.FunctionDef)

        return edit_outer

    def _edit_function(
        self, module: cst.Module, name: str, edit: Callable[[cst.FunctionDef], cst.FunctionDef]
    ) -> cst.Module:
        found = [i for i, s in enumerate(module.body) if _is_def(s, name)]
        if len(found) != 1:
            raise AnchorError(f"{self.target}", f"one module-level function `{name}`", f"{len(found)} such functions")
        return _replaced(module, module.body, found[0], edit)

    def _hoist(self, fn: cst.FunctionDef, op: HoistKeyword, strip: bool) -> cst.FunctionDef:
        scope = f"{self.target}: {_scope_name(op)}"
        found = 0

        def keyword_of(stmt: Statement) -> cst.Arg | None:
            calls = findall(stmt, op.call)
            args = [a for c in calls for a in c.args if a.keyword is not None and a.keyword.value == op.keyword]  # type: ignore[attr-defined]
            return args[0] if len(calls) == 1 and len(args) == 1 else None

        def edit(stmts: list[Statement], is_method_body: bool) -> list[Statement]:
            nonlocal found
            out: list[Statement] = []
            for stmt in stmts:
                arg = keyword_of(stmt) if isinstance(stmt, cst.SimpleStatementLine) else None
                if arg is None:
                    out.append(stmt)
                    continue
                found += 1
                named = m.matches(arg.value, m.Name(op.name))
                if strip:
                    prev = out[-1] if out else None
                    pattern = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(m.Name(op.name))])])
                    if named and prev is not None and m.matches(prev, pattern):
                        out.pop()
                        assignment = cst.ensure_type(prev, cst.SimpleStatementLine).body[0]
                        value = cst.ensure_type(assignment, cst.Assign).value
                        stmt = _statement(stmt.deep_replace(arg, arg.with_changes(value=value)))
                    out.append(stmt)
                    continue
                hoisted = cst.parse_statement(f"{op.name} = _  # rlprobe-patch")
                hoisted = hoisted.visit(_Substitute({"_": arg.value}))  # type: ignore[assignment]
                named_stmt = stmt.deep_replace(arg, arg.with_changes(value=cst.Name(op.name)))
                out += [hoisted, _statement(named_stmt)]
            return out

        new_fn = _BlockEditor(fn, ANY, edit).run()
        if not strip and found != 1:
            raise AnchorError(scope, f"exactly one {op.expected}", "none" if not found else f"{found} (ambiguous)")
        assert isinstance(new_fn, cst.FunctionDef)
        return new_fn

    def _edit_class(self, module: cst.Module, name: str, edit: Callable[[cst.ClassDef], cst.ClassDef]) -> cst.Module:
        found = [i for i, s in enumerate(module.body) if _is_class(s, name)]
        if len(found) != 1:
            raise AnchorError(f"{self.target}", f"one module-level class `{name}`", f"{len(found)} such classes")
        return _replaced(module, module.body, found[0], edit)

    def _edit_method(
        self, cls: cst.ClassDef, method: str, edit: Callable[[cst.FunctionDef], cst.FunctionDef]
    ) -> cst.ClassDef:
        if not isinstance(cls.body, cst.IndentedBlock):  # `class A: pass`
            raise AnchorError(f"{self.target}: class {cls.name.value}", f"one method `{method}`", "a one-line body")
        found = [i for i, s in enumerate(cls.body.body) if _is_def(s, method)]
        if len(found) != 1:
            raise AnchorError(
                f"{self.target}: class {cls.name.value}", f"one method `{method}`", f"{len(found)} such methods"
            )
        return _replaced(cls, cls.body.body, found[0], edit)

    def _add_methods(self, cls: cst.ClassDef, op: AddMethods, params: dict[str, str], strip: bool) -> cst.ClassDef:
        if not isinstance(cls.body, cst.IndentedBlock):  # `class A: pass` holds nothing of ours
            if strip:
                return cls
            raise AnchorError(f"{self.target}: class {op.cls}", "a class body of its own lines", "a one-line body")
        ours = [self.bake(fn, params) for fn in self.payload.methods(op.payload_cls or op.cls)]
        names = {fn.name.value for fn in ours}  # type: ignore[attr-defined]
        body = [s for s in cls.body.body if not (isinstance(s, cst.FunctionDef) and s.name.value in names)]
        if strip and len(body) == len(cls.body.body):
            return cls
        if not strip:
            if len(body) != len(cls.body.body):
                clash = sorted(names & {s.name.value for s in cls.body.body if isinstance(s, cst.FunctionDef)})
                raise AnchorError(
                    f"{self.target}: class {op.cls}",
                    "no method named " + ", ".join(f"`{n}`" for n in sorted(names)),
                    "upstream (or a hand edit) already defines " + ", ".join(f"`{n}`" for n in clash),
                )
            body += [cst.ensure_type(_with_blank_line(fn), cst.FunctionDef) for fn in ours]
        return cls.with_changes(body=cls.body.with_changes(body=body))

    def _add_definitions(
        self, module: cst.Module, op: AddDefinitions, params: dict[str, str], strip: bool
    ) -> cst.Module:
        body = [s for s in module.body if defined_name(s) not in op.names]
        if strip:
            return module if len(body) == len(module.body) else module.with_changes(body=body)
        if len(body) != len(module.body):
            clash = sorted({name for s in module.body if (name := defined_name(s))} & set(op.names))
            raise AnchorError(
                f"{self.target} (module level)",
                "no definition named " + ", ".join(f"`{n}`" for n in op.names),
                "upstream (or a hand edit) already defines " + ", ".join(f"`{n}`" for n in clash),
            )
        ours = [_with_two_blank_lines(self.bake(s, params)) for s in self.payload.definitions(op.names)]
        return module.with_changes(body=[*body, *ours])

    def _hook(self, fn: cst.FunctionDef, op: Hook, params: dict[str, str], strip: bool) -> cst.FunctionDef:
        scope = f"{self.target}: {_scope_name(op)}"
        if op.parameters and not strip:
            declared = {p.name.value for p in (*fn.params.posonly_params, *fn.params.params, *fn.params.kwonly_params)}
            if missing := [name for name in op.parameters if name not in declared]:
                wanted = ", ".join(f"`{name}`" for name in op.parameters)
                raise AnchorError(scope, f"the parameter {wanted}", "no " + ", ".join(f"`{n}`" for n in missing))
        base = [self.bake(s, params) for s in self.payload.statements(op.payload)]
        anchors = 0

        def payload_for(anchor: Statement | None) -> list[Statement]:
            if op.template is None or anchor is None:
                return base  # type: ignore[return-value]
            names = op.template(anchor)
            return [s.visit(_Substitute(names)) for s in base]  # type: ignore[misc]

        def matches_at(stmts: list[Statement], start: int, ours: list[Statement]) -> bool:
            window = stmts[start : start + len(ours)]
            return (
                start >= 0
                and len(window) == len(ours)
                and all(statement_key(a) == statement_key(b) for a, b in zip(window, ours))
            )

        def edit(stmts: list[Statement], is_method_body: bool) -> list[Statement]:
            nonlocal anchors
            if op.where in (Where.START, Where.END):
                ours = payload_for(None)
                if op.where is Where.START:
                    at = 1 if is_method_body and stmts and _is_docstring(stmts[0]) else 0
                else:
                    at = len(stmts) - len(ours) if strip else len(stmts)
                if strip:
                    return stmts[:at] + stmts[at + len(ours) :] if matches_at(stmts, at, ours) else stmts
                return stmts[:at] + ours + stmts[at:]
            out: list[Statement] = []
            i = 0
            while i < len(stmts):
                stmt = stmts[i]
                assert op.anchor is not None
                if not op.anchor(stmt):
                    out.append(stmt)
                    i += 1
                    continue
                anchors += 1
                ours = payload_for(stmt)
                if op.where is Where.BEFORE:
                    if strip:
                        if len(out) >= len(ours) and matches_at(out, len(out) - len(ours), ours):
                            del out[len(out) - len(ours) :]
                    else:
                        out += ours
                    out.append(stmt)
                    i += 1
                else:
                    out.append(stmt)
                    i += 1
                    if strip:
                        if matches_at(stmts, i, ours):
                            i += len(ours)
                    else:
                        out += ours
            return out

        editor = _BlockEditor(fn, op.block, edit)
        new_fn = editor.run()
        if op.where in (Where.START, Where.END):
            if editor.blocks_matched != 1 and not strip:
                raise AnchorError(scope, op.expected or "one block", f"{editor.blocks_matched}")
        elif not strip:
            if anchors == 0:
                raise AnchorError(scope, op.expected, "none")
            if anchors > 1 and not op.many:
                raise AnchorError(scope, f"exactly one {op.expected}", f"{anchors} (ambiguous)")
        assert isinstance(new_fn, cst.FunctionDef)
        return new_fn


# -- finding nodes --------------------------------------------------------------------------
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


# -- matchers shared by patches -------------------------------------------------------------
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


class ConfigPathParam(PatchCodemod):
    """Patches whose payload reads `self._rlprobe_config_path("<ENV_VAR>", "<default>")` (the shared
    switch reader, `patches/_shared/switches.py`; SGLang's `self._msprobe_config_path`, which calls
    it), or `os.environ.get("<ENV_VAR>", "<default>")`
    (the revisions before it, still read back from trees they patched).

    `apply --msprobe-config PATH` (or the patch's own option, PARAM) bakes PATH in as the
    default; `read_params` reads it back from a patched tree so that its state can be decided
    without any record.
    """

    ENV_VAR: ClassVar[str] = "MSPROBE_ACTOR_CONFIG"
    PARAM: ClassVar[str] = "msprobe_config"
    PARAMS: ClassVar[dict[str, str]] = {"msprobe_config": "/home/config_actor.json"}

    def _env_get(self) -> m.Call:
        return m.Call(
            func=m.Attribute(value=m.Attribute(value=m.Name("os"), attr=m.Name("environ")), attr=m.Name("get"))
            | m.Attribute(value=m.Name("self"), attr=m.Name("_rlprobe_config_path") | m.Name("_msprobe_config_path")),
            args=[m.Arg(m.SimpleString(f'"{self.ENV_VAR}"')), m.Arg(m.SimpleString())],
        )

    def bake(self, stmt: cst.CSTNode, params: dict[str, str]) -> cst.CSTNode:
        path = params[self.PARAM]
        if path == self.PARAMS[self.PARAM]:
            return stmt

        def with_path(call: cst.CSTNode, _: object) -> cst.CSTNode:
            default = cst.ensure_type(call, cst.Call).args[1]
            return call.with_deep_changes(default, value=cst.SimpleString(_quote(path)))

        baked = m.replace(stmt, self._env_get(), with_path)
        assert isinstance(baked, cst.CSTNode)
        return baked

    def read_params(self, module: cst.Module) -> dict[str, str]:
        for call in findall(_added_methods_of(self, module), self._env_get()):
            value = cst.ensure_type(call, cst.Call).args[1].value
            return {self.PARAM: str(cst.ensure_type(value, cst.SimpleString).evaluated_value)}
        return dict(self.PARAMS)


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _added_methods_of(codemod: PatchCodemod, module: cst.Module) -> cst.Module:
    """Only the methods (and module-level definitions) our AddMethods (AddDefinitions) operations own:
    searching them is far cheaper than the file."""
    found: list[cst.BaseStatement] = []
    for op in codemod.OPERATIONS:
        if isinstance(op, AddDefinitions):
            found += [stmt for stmt in module.body if defined_name(stmt) in op.names]
        if not isinstance(op, AddMethods):
            continue
        names = {fn.name.value for fn in codemod.payload.methods(op.payload_cls or op.cls)}
        for stmt in module.body:
            ours = isinstance(stmt, cst.ClassDef) and stmt.name.value == op.cls
            if ours and isinstance(stmt, cst.ClassDef) and isinstance(stmt.body, cst.IndentedBlock):
                found += [s for s in stmt.body.body if isinstance(s, cst.FunctionDef) and s.name.value in names]
    return module_of(found)


class CreateFile:
    """A site that is a whole new file: the payload file `FILE` (beside payload.py), verbatim.

    Absent: APPLICABLE. Present with our syntax tree: APPLIED. Present otherwise: DRIFTED
    (the release, or someone, already has a file there: never overwritten).
    """

    DESCRIPTION: ClassVar[str] = ""
    FILE: ClassVar[str] = ""
    PARAMS: ClassVar[dict[str, str]] = {}

    def __init__(self, payload: Payload, target: str) -> None:
        self.source = payload.path.parent / self.FILE
        self.target = target

    @property
    def content(self) -> bytes:
        return self.source.read_bytes()

    def state_of(self, data: bytes | None) -> StateReport:
        if data is None:
            return StateReport(State.APPLICABLE)
        try:
            ours = syntax_key(data.decode("utf-8")) == syntax_key(self.content.decode("utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            ours = False
        if ours:
            return StateReport(State.APPLIED)
        return StateReport(State.DRIFTED, (f"{self.target}: exists and is not the file this patch adds",))
