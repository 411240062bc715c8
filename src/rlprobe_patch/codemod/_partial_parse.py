"""Partial parsing: LibCST parses only the parts of a file that a plan's codemods read.

A codemod reads a file at the places its operations name (`PatchCodemod.scope`): the module's
statement lines (imports and assignments), the module-level classes and functions it names, and
in a class, the methods it names. The rest of a big file (most of verl's trainers and workers) is
never looked at, yet parsing and generating it was most of an apply. So each run of statements no
codemod reads is replaced, before LibCST parses the file, by one placeholder line at the same
indentation (`pass  # <marker> <n>`), and the original text of the run is put back, byte for byte,
into the code LibCST generates (`Partial.splice`).

The splice gives exactly the bytes a whole-file parse would, because LibCST gives every line the
same owner in both texts (tests/real/test_partial_real.py checks it on every class of real releases):
- a statement is replaced whole, from its first decorator to its last line; the blank and comment
  lines between it and a statement that is kept stay in the text, so each keeps its owner (a
  block's footer or the next statement's leading lines: LibCST decides by indentation, and the
  placeholder stands at the same indentation as the statement it replaces);
- the last statement of a block is kept unless only blank lines and comments at column 0 follow
  it, so that code appended to a class or a module lands after the same lines;
- the first indented block of the file is kept (as a class shell, or whole), so that LibCST
  infers the same default indentation, which inserted code is written with.

Files that do not fit (a newline other than `\\n`, no newline at the end, an encoding other than
UTF-8, a syntax error, a statement that does not start its line) are parsed whole, as before.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_CLEAN = re.compile(rb"(?:\n|#[^\n]*\n)*")  # blank lines and comments at column 0
# What a block keeps of a statement: True, whole; a set of method names, a class as a shell that
# holds those methods; False, nothing (a placeholder stands for it).
_Verdict = bool | frozenset[str]
_Keep = Callable[[ast.stmt], _Verdict]


@dataclass(frozen=True)
class Scope:
    """What codemods read of a file: module-level classes and functions read whole (`names`),
    and the classes of which they read only some methods (`methods`: class -> method names).
    Module-level statement lines are always read."""

    names: frozenset[str] = frozenset()
    methods: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def __or__(self, other: Scope) -> Scope:
        methods = dict(self.methods)
        for cls, names in other.methods.items():
            methods[cls] = methods.get(cls, frozenset()) | names
        return Scope(self.names | other.names, methods)

    def covers(self, other: Scope) -> bool:
        return other.names <= self.names and all(
            cls in self.names or names <= self.methods.get(cls, frozenset()) for cls, names in other.methods.items()
        )


@dataclass(frozen=True)
class Partial:
    """The text LibCST parses in place of a file, and how to put the file back together."""

    text: bytes
    runs: tuple[bytes, ...]  # the original text of each placeholder, by number
    marker: str
    indent: str  # the default indentation LibCST must infer from `text`: the whole file's

    def splice(self, code: str) -> str:
        """The whole file's code, from the code LibCST generated for `text` (transformed or not)."""
        seen: list[int] = []

        def original(match: re.Match[str]) -> str:
            seen.append(int(match.group(1)))
            return self.runs[seen[-1]].decode("utf-8")

        pattern = re.compile(rf"^[ \t]*pass  # {self.marker} (\d+)\n", re.MULTILINE)
        whole = pattern.sub(original, code)
        if sorted(seen) != list(range(len(self.runs))):  # a codemod moved or dropped a placeholder: a bug
            raise RuntimeError(f"partial parse: placeholders {sorted(seen)} of {len(self.runs)} found in the code")
        return whole


class _Whole(Exception):
    """The file does not fit partial parsing: parse it whole."""


def reduce(data: bytes, scope: Scope) -> Partial | None:
    """`data` with what `scope` does not read replaced by placeholders; None: parse it whole."""
    if b"\r" in data or not data.endswith(b"\n"):
        return None
    try:
        if tokenize.detect_encoding(io.BytesIO(data).readline)[0] != "utf-8":
            return None
        module = ast.parse(data)
    except (SyntaxError, ValueError):
        return None  # the whole-file parse says what is wrong
    reducer = _Reducer(data.splitlines(keepends=True), scope)
    try:
        reducer.module(module.body)
    except _Whole:
        return None
    if not reducer.runs:
        return None
    return Partial(b"".join(reducer.out), tuple(reducer.runs), reducer.marker, reducer.indent)


def _first_line(stmt: ast.stmt) -> int:
    decorators = getattr(stmt, "decorator_list", None)
    return decorators[0].lineno if decorators else stmt.lineno


def _indent_of_block(lines: list[bytes], stmt: ast.stmt) -> str | None:
    body = getattr(stmt, "body", None)
    if not body or not isinstance(body[0], ast.stmt):
        return None
    line = lines[_first_line(body[0]) - 1]
    indent = line[: len(line) - len(line.lstrip(b" \t"))]
    return indent.decode() if _starts_line(lines, body[0], indent) and _first_line(body[0]) > stmt.lineno else None


def _starts_line(lines: list[bytes], stmt: ast.stmt, indent: bytes) -> bool:
    """Whether `stmt` (its first decorator) is the first thing on its first line, at `indent`."""
    line = lines[_first_line(stmt) - 1]
    if not line.startswith(indent) or line[len(indent) : len(indent) + 1] in (b" ", b"\t"):
        return False
    if getattr(stmt, "decorator_list", None):
        return line[len(indent) : len(indent) + 1] == b"@"
    return stmt.col_offset == len(indent)


class _Reducer:
    def __init__(self, lines: list[bytes], scope: Scope) -> None:
        self.lines = lines
        self.scope = scope
        self.marker = "rlprobe-partial-" + uuid.uuid4().hex
        self.out: list[bytes] = []
        self.runs: list[bytes] = []
        self.indent = "    "  # LibCST's default when a file has no indented block

    def text(self, first: int, last: int) -> bytes:
        """Lines `first` to `last` (1-based, inclusive)."""
        return b"".join(self.lines[first - 1 : last])

    def module(self, body: list[ast.stmt]) -> None:
        if not body:
            raise _Whole
        # LibCST takes the default indentation from the first indented block: it is kept.
        first_block = next((s for s in body if hasattr(s, "body")), None)
        if first_block is not None:
            indent = _indent_of_block(self.lines, first_block)
            if indent is None:
                raise _Whole  # `if x: y` first: the first indented block is a later one
            self.indent = indent
        last = body[-1].end_lineno or 0
        tail = self.text(last + 1, len(self.lines))
        self.out.append(self.text(1, _first_line(body[0]) - 1))
        self.block(body, b"", lambda s: self.keep_module_level(s, first_block), _CLEAN.fullmatch(tail) is not None)
        self.out.append(tail)

    def keep_module_level(self, stmt: ast.stmt, first_block: ast.stmt | None) -> _Verdict:
        """True: kept whole; a set of method names: a class kept as a shell; False: replaced."""
        if not isinstance(stmt, _DEFS):
            return not hasattr(stmt, "body") or stmt is first_block  # statement lines are read
        if stmt.name in self.scope.names:
            return True
        if isinstance(stmt, ast.ClassDef) and (stmt.name in self.scope.methods or stmt is first_block):
            return self.scope.methods.get(stmt.name, frozenset())
        return stmt is first_block

    def block(self, body: list[ast.stmt], indent: bytes, keep: _Keep, after_clean: bool) -> None:
        """Emit the statements of one block (from the first statement's first line to the last's
        last line), replacing the runs of statements `keep` rejects."""
        groups: list[list[ast.stmt]] = []
        for stmt in body:  # statements sharing a line (`a = 1; b = 2`) go together
            if not _starts_line(self.lines, stmt, indent):
                if groups and _first_line(stmt) <= (groups[-1][-1].end_lineno or 0):
                    groups[-1].append(stmt)
                    continue
                raise _Whole
            groups.append([stmt])
        run_start: int | None = None
        previous_end = 0
        for i, group in enumerate(groups):
            first, last = _first_line(group[0]), group[-1].end_lineno or 0
            verdict: _Verdict = keep(group[0]) if len(group) == 1 else any(keep(s) is not False for s in group)
            if i == len(groups) - 1 and not after_clean and verdict is False:
                verdict = True  # what follows it may be its footer: appended code must land after it
            if verdict is False:
                if run_start is None:
                    if i:
                        self.out.append(self.text(previous_end + 1, first - 1))
                    run_start = first
            else:
                if run_start is not None:
                    self.placeholder(run_start, previous_end, indent)
                    run_start = None
                if i:
                    self.out.append(self.text(previous_end + 1, first - 1))
                if verdict is True:
                    self.out.append(self.text(first, last))
                else:
                    assert isinstance(group[0], ast.ClassDef)
                    self.shell(group[0], verdict, after_clean=_CLEAN.fullmatch(self.after(last)) is not None)
            previous_end = last
        if run_start is not None:
            self.placeholder(run_start, previous_end, indent)

    def after(self, last: int) -> bytes:
        """The blank and comment lines after line `last`, up to the next statement line."""
        lines = []
        for line in self.lines[last:]:
            stripped = line.lstrip(b" \t")
            if stripped and stripped != b"\n" and not stripped.startswith(b"#"):
                break
            lines.append(line)
        return b"".join(lines)

    def shell(self, cls: ast.ClassDef, methods: frozenset[str], after_clean: bool) -> None:
        """A class with only `methods` (and its last statement, unless `after_clean`) kept."""
        indent_text = _indent_of_block(self.lines, cls)
        if indent_text is None:
            raise _Whole  # `class A: x = 1`
        first = _first_line(cls.body[0])
        self.out.append(self.text(_first_line(cls), first - 1))  # decorators, header, comments
        self.block(
            cls.body,
            indent_text.encode(),
            lambda s: isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name in methods,
            after_clean,
        )

    def placeholder(self, first: int, last: int, indent: bytes) -> None:
        self.out.append(indent + f"pass  # {self.marker} {len(self.runs)}\n".encode())
        self.runs.append(self.text(first, last))
