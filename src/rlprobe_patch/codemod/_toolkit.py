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

The pieces: `_operations` (the declaration's vocabulary), `_payload` (the payload file), `_syntax` (trees compared
and built), `_anchors` (finding nodes), `_blocks` (the blocks an operation edits, a hook's places); here the
codemod classes that put them together: `PatchCodemod`, `ConfigPathParam`, `CreateFile`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar, cast

import libcst as cst
import libcst.matchers as m

from rlprobe_patch.codemod._anchors import findall
from rlprobe_patch.codemod._blocks import BlockEditor, HoistEdit, HookEdit, replaced
from rlprobe_patch.codemod._operations import (
    ANY,
    AddDefinitions,
    AddMethods,
    AnchorError,
    HoistKeyword,
    Hook,
    Operation,
    State,
    Statement,
    StateReport,
    Where,
    scope_name,
)
from rlprobe_patch.codemod._partial_parse import Scope
from rlprobe_patch.codemod._payload import Payload
from rlprobe_patch.codemod._syntax import (
    bound_name,
    defined_name,
    is_class,
    is_def,
    module_of,
    same_syntax,
    syntax_key,
    with_blank_line,
    with_two_blank_lines,
)


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
                    defined.update(bound_name(a).split(".")[0] for a in small.names)
                elif isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
                    defined.update(bound_name(a) for a in small.names)
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
                    f"{self.target}: {scope_name(op)}", f"one nested function `{op.inner}`", f"{len(found)}"
                )
            inner = found[0]
            assert isinstance(inner, cst.FunctionDef)
            return cst.ensure_type(outer.deep_replace(inner, edit(inner)), cst.FunctionDef)

        return edit_outer

    def _edit_function(
        self, module: cst.Module, name: str, edit: Callable[[cst.FunctionDef], cst.FunctionDef]
    ) -> cst.Module:
        found = [i for i, s in enumerate(module.body) if is_def(s, name)]
        if len(found) != 1:
            raise AnchorError(f"{self.target}", f"one module-level function `{name}`", f"{len(found)} such functions")
        return replaced(module, module.body, found[0], edit)

    def _hoist(self, fn: cst.FunctionDef, op: HoistKeyword, strip: bool) -> cst.FunctionDef:
        edit = HoistEdit(op, strip)
        new_fn = BlockEditor(fn, ANY, edit).run()
        if not strip and edit.found != 1:
            scope = f"{self.target}: {scope_name(op)}"
            raise AnchorError(
                scope, f"exactly one {op.expected}", "none" if not edit.found else f"{edit.found} (ambiguous)"
            )
        return new_fn

    def _edit_class(self, module: cst.Module, name: str, edit: Callable[[cst.ClassDef], cst.ClassDef]) -> cst.Module:
        found = [i for i, s in enumerate(module.body) if is_class(s, name)]
        if len(found) != 1:
            raise AnchorError(f"{self.target}", f"one module-level class `{name}`", f"{len(found)} such classes")
        return replaced(module, module.body, found[0], edit)

    def _edit_method(
        self, cls: cst.ClassDef, method: str, edit: Callable[[cst.FunctionDef], cst.FunctionDef]
    ) -> cst.ClassDef:
        if not isinstance(cls.body, cst.IndentedBlock):  # `class A: pass`
            raise AnchorError(f"{self.target}: class {cls.name.value}", f"one method `{method}`", "a one-line body")
        found = [i for i, s in enumerate(cls.body.body) if is_def(s, method)]
        if len(found) != 1:
            raise AnchorError(
                f"{self.target}: class {cls.name.value}", f"one method `{method}`", f"{len(found)} such methods"
            )
        return replaced(cls, cls.body.body, found[0], edit)

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
            body += [cst.ensure_type(with_blank_line(fn), cst.FunctionDef) for fn in ours]
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
        ours = [with_two_blank_lines(self.bake(s, params)) for s in self.payload.definitions(op.names)]
        return module.with_changes(body=[*body, *ours])

    def _hook(self, fn: cst.FunctionDef, op: Hook, params: dict[str, str], strip: bool) -> cst.FunctionDef:
        scope = f"{self.target}: {scope_name(op)}"
        if op.parameters and not strip:
            declared = {p.name.value for p in (*fn.params.posonly_params, *fn.params.params, *fn.params.kwonly_params)}
            if missing := [name for name in op.parameters if name not in declared]:
                wanted = ", ".join(f"`{name}`" for name in op.parameters)
                raise AnchorError(scope, f"the parameter {wanted}", "no " + ", ".join(f"`{n}`" for n in missing))
        payload = [cast(Statement, self.bake(s, params)) for s in self.payload.statements(op.payload)]
        edit = HookEdit(op, payload, strip)
        editor = BlockEditor(fn, op.block, edit)
        new_fn = editor.run()
        if op.where in (Where.START, Where.END):
            if editor.blocks_matched != 1 and not strip:
                raise AnchorError(scope, op.expected or "one block", f"{editor.blocks_matched}")
        elif not strip:
            if edit.anchors == 0:
                raise AnchorError(scope, op.expected, "none")
            if edit.anchors > 1 and not op.many:
                raise AnchorError(scope, f"exactly one {op.expected}", f"{edit.anchors} (ambiguous)")
        return new_fn


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
