"""A launch script read the way bash reads it, without running it.

The script is parsed with tree-sitter's bash grammar and evaluated statically: assignments and
`export`, `${V}` / `${V:-d}` / `${V:=d}` / `${V-d}` / `${V:+a}` / `${V%p}` / `${V#p}` / `${V/a/b}`,
arrays (`A=(...)`, `A+=(...)`, `"${A[@]}"`), positional parameters (`"$@"` are the arguments the
user passes, `--arg`), `$0`, `$(dirname "$0")`, `$(cd "$(dirname "$0")" && pwd)`, `$(pwd)`,
`$((arithmetic))`, `source` / `.` of files that exist, functions, `bash other.sh`, `if` / `case` /
`for` whose conditions resolve. What cannot be evaluated (other command substitutions,
here-documents, `while` loops, conditions on things only a run knows) is reported as
unresolved with its line, never guessed; when a condition does not resolve, every branch is
read and the values that differ between branches are reported.

The result is every command the script would run (`Run`), each argument with the file and
line it was written on, and the environment it would see.
"""

from __future__ import annotations

import ast
import fnmatch
import operator
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rlprobe_patch.base.errors import RefusedError
from rlprobe_patch.base.interpreter import finds

MAX_BYTES = 2_000_000  # launch scripts are a few KiB; bigger files are not launch scripts
MAX_DEPTH = 16  # nested `source`, functions and `bash other.sh`
MAX_LOOP = 256


@dataclass(frozen=True)
class Field:
    """One argument after expansion: its text and where it was written."""

    text: str
    file: Path
    line: int
    unresolved: tuple[str, ...] = ()  # pieces that were not evaluated (their text is kept as written)
    via: tuple[str, ...] = ()  # variables it read, with where each got its value

    @property
    def source(self) -> str:
        return f"{self.file.name}:{self.line}"

    @property
    def exact(self) -> bool:
        return not self.unresolved


@dataclass(frozen=True)
class Var:
    items: tuple[Field, ...]
    array: bool = False
    exported: bool = False
    origin: str = ""  # "run.sh:12", "--env"
    alternatives: tuple[str, ...] = ()  # values in other branches of an unresolved condition

    @property
    def text(self) -> str:
        return " ".join(f.text for f in self.items)


@dataclass
class Unresolved:
    file: Path
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.file.name}:{self.line}: {self.what}"


@dataclass
class Run:
    """A simple command the script would run, with its arguments and environment."""

    argv: list[Field]
    env: dict[str, Field]  # exported variables and `NAME=value` prefixes
    file: Path
    line: int
    start_byte: int  # the command's span in `file`, for editing a copy
    end_byte: int
    args_end_byte: int  # after the last argument, before redirections
    cwd: Path = Path()  # the working directory it would run in
    conditions: tuple[str, ...] = ()  # unresolved conditions it sits under
    functions: tuple[str, ...] = ()  # functions it was called through


@dataclass(frozen=True)
class Probe:
    """A variable assigned from an import probe, and how a derived script can pin its answer."""

    value: str  # the probe's answer (by the interpreter that read the script)
    where: str  # file:line of the assignment
    keeps: bool  # `NAME=${NAME:-$(...)}`: bash keeps a value exported before the script
    # `NAME=$(...)` alone on its line in the script itself: the byte offset of that line's end, where
    # a re-assignment on a line of its own pins the answer; None elsewhere (a sourced file, a line
    # shared with other commands)
    line_end: int | None = None


@dataclass
class Reading:
    path: Path
    runs: list[Run] = field(default_factory=list)
    unresolved: list[Unresolved] = field(default_factory=list)
    variables: dict[str, Var] = field(default_factory=dict)  # at the end of the script
    files: list[Path] = field(default_factory=list)  # the script and every file it sourced
    code: list[str] = field(default_factory=list)  # each file's text with its comments blanked out
    # variables whose value came from an import probe (`$(python3 -c 'import torch_npu' && ...)`)
    probed: dict[str, Probe] = field(default_factory=dict)
    python: str = ""  # the interpreter that answered the import probes


class _Exit(Exception):
    pass


class _Return(Exception):
    pass


_PARSER: Any = None


def parse(source: bytes) -> Any:
    global _PARSER
    if _PARSER is None:
        import tree_sitter_bash
        from tree_sitter import Language, Parser

        _PARSER = Parser(Language(tree_sitter_bash.language()))
    return _PARSER.parse(source)


def read_text(path: Path) -> bytes:
    """The bytes of a script, refused (exit 3) when it cannot be a launch script."""
    if not path.is_file():
        raise RefusedError(f"{path}: no such file", hint="pass the training script (e.g. run_qwen_grpo.sh)")
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise RefusedError(f"{path}: {size} bytes is not a launch script (the reader stops at {MAX_BYTES})")
    data = path.read_bytes()
    if b"\0" in data:
        raise RefusedError(f"{path}: a binary file, not a shell script")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RefusedError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return data


def syntax_errors(tree: Any) -> list[tuple[int, str]]:
    """(line, text) of each ERROR or missing node."""
    found: list[tuple[int, str]] = []
    cursor = [tree.root_node]
    while cursor:
        node = cursor.pop()
        if node.type == "ERROR" or node.is_missing:
            text = node.text.decode("utf-8", "replace").splitlines()[0][:60] if node.text else node.type
            found.append((node.start_point[0] + 1, text))
        elif node.has_error:
            cursor.extend(reversed(node.children))
    return sorted(found)


def read_shell(
    path: Path,
    *,
    args: list[str] | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    python: str | None = None,
) -> Reading:
    """Evaluate `path` statically. `args` are "$@", `env` the caller's environment (`--env`), `python`
    the interpreter that answers import probes (default: this one)."""
    path = Path(path)
    evaluator = _Evaluator(path, cwd or Path.cwd())
    evaluator.python = python or sys.executable
    evaluator.reading.python = evaluator.python
    for name, value in (env or {}).items():
        evaluator.vars[name] = Var((Field(value, Path("--env"), 0),), exported=True, origin="--env")
    evaluator.positional = [Field(a, Path("--arg"), 0) for a in (args or [])]
    evaluator.run_file(path.absolute(), is_script=True)
    reading = evaluator.reading
    reading.variables = dict(evaluator.vars)
    return reading


_SPLIT = re.compile(r"[ \t\n]+")


@dataclass
class _Seg:
    text: str
    split: bool = False  # unquoted expansion: subject to word splitting
    origin: Field | None = None  # an array element keeps where it was written
    unresolved: tuple[str, ...] = ()
    via: tuple[str, ...] = ()


_BREAK = _Seg("\0break")  # a field boundary ("${A[@]}")


class _Evaluator:
    def __init__(self, script: Path, cwd: Path) -> None:
        self.script = script.absolute()
        self.reading = Reading(script)
        self.vars: dict[str, Var] = {}
        self.functions: dict[str, tuple[Any, Path]] = {}
        self.positional: list[Field] = []
        self.cwd = cwd
        self.python = sys.executable
        self.stack: list[Path] = []  # files being evaluated
        self.conditions: list[str] = []
        self.call_stack: list[str] = []
        self.file = script
        self.source = b""
        self.locals: list[dict[str, Var | None]] = []

    # -- files -------------------------------------------------------------------------------

    def run_file(self, path: Path, *, is_script: bool = False) -> None:
        if path in self.stack:
            chain = " -> ".join(p.name for p in [*self.stack, path])
            raise RefusedError(f"{self.script}: `source` loop ({chain})")
        if len(self.stack) >= MAX_DEPTH:
            raise RefusedError(f"{self.script}: files source each other {MAX_DEPTH} deep ({path.name})")
        data = read_text(path)
        tree = parse(data)
        errors = syntax_errors(tree)
        if errors:
            line, text = errors[0]
            verdict = _bash_verdict(path)
            if verdict is not None:  # bash's own words: they name the line bash stops at
                raise RefusedError(f"{path}: bash syntax error: {verdict}", hint="`bash -n` shows it too")
            for line, text in errors:  # valid bash that the grammar does not know: say what was skipped
                self.reading.unresolved.append(Unresolved(path, line, f"`{text}` not understood by the reader"))
        self.reading.code.append(_without_comments(tree, data))
        saved = (self.file, self.source)
        self.file, self.source = path, data
        self.stack.append(path)
        self.reading.files.append(path)
        try:
            self.block(tree.root_node.children)
        except _Exit:
            if not is_script:
                raise
        finally:
            self.stack.pop()
            self.file, self.source = saved

    def note(self, node: Any, what: str) -> None:
        self.reading.unresolved.append(Unresolved(self.file, node.start_point[0] + 1, what))

    def line(self, node: Any) -> int:
        return int(node.start_point[0]) + 1

    def here(self, node: Any) -> str:
        return f"{self.file.name}:{self.line(node)}"

    # -- statements --------------------------------------------------------------------------

    def block(self, nodes: Any) -> None:
        for node in nodes:
            if node.is_named:
                self.statement(node)

    def statement(self, node: Any) -> None:
        kind = node.type
        handler = _STATEMENTS.get(kind)
        if handler is not None:
            handler(self, node)
        elif kind in ("comment", "heredoc_body", "heredoc_start"):
            return
        else:
            self.note(node, f"`{_first_line(node)}` ({kind}) not evaluated")

    def s_program(self, node: Any) -> None:
        self.block(node.children)

    def s_assignment(self, node: Any, *, exported: bool = False, local: bool = False) -> None:
        name_node = node.child_by_field_name("name")
        value_node = node.child_by_field_name("value")
        if name_node is None:
            return
        name = name_node.text.decode()
        if name_node.type == "subscript":  # A[i]=v: the array as a whole is no longer known exactly
            self.note(node, f"element assignment {name} not evaluated")
            return
        append = any(c.type == "+=" for c in node.children)
        if value_node is None:
            items: tuple[Field, ...] = (Field("", self.file, self.line(node)),)
            array = False
        elif value_node.type == "array":
            items = tuple(f for group in _glued(value_node.children) for f in self.words_of(group))
            array = True
        else:
            items = (self.join(value_node),)
            array = False
        old = self.vars.get(name)
        if append and old is not None:
            if array or old.array:
                items = old.items + items
                array = True
            else:
                f = items[0]
                items = (replace(f, text=old.text + f.text, unresolved=old.items[0].unresolved + f.unresolved),)
        if local and self.locals and name not in self.locals[-1]:
            self.locals[-1][name] = old
        self.vars[name] = Var(
            items, array=array, exported=exported or bool(old and old.exported), origin=self.here(node)
        )
        if not array and any(v.startswith(PROBE_VIA) for f in items for v in f.via):
            text = value_node.text.decode() if value_node is not None else ""
            keeps = bool(re.match(rf"[\"']?\$\{{{re.escape(name)}:?[-=]", text))  # ${NAME:-...}: an exported value wins
            self.reading.probed[name] = Probe(items[0].text, self.here(node), keeps, self._line_end(node))

    def _line_end(self, node: Any) -> int | None:
        """The end of the line of an assignment statement that has the line to itself, in the script
        itself (not a sourced file); None otherwise."""
        statement = node.parent if node.parent is not None and node.parent.type == "declaration_command" else node
        if self.file != self.reading.path:
            return None
        start = self.source.rfind(b"\n", 0, statement.start_byte) + 1
        end = self.source.find(b"\n", statement.end_byte)
        end = len(self.source) if end < 0 else end
        before, after = self.source[start : statement.start_byte], self.source[statement.end_byte : end]
        if before.strip() or (after.strip() and not after.strip().startswith(b"#")) or after.rstrip().endswith(b"\\"):
            return None
        return end

    def s_declaration(self, node: Any) -> None:
        keyword = node.children[0].type
        flags = "".join(c.text.decode()[1:] for c in node.children if c.type == "word" and c.text.startswith(b"-"))
        exported = keyword == "export" or "x" in flags
        local = keyword in ("local", "declare", "typeset") and bool(self.call_stack) and "g" not in flags
        for child in node.children[1:]:
            if child.type == "variable_assignment":
                self.s_assignment(child, exported=exported, local=local)
            elif child.type == "variable_name" and exported:
                name = child.text.decode()
                old = self.vars.get(name)
                if old is not None:
                    self.vars[name] = replace(old, exported=True)

    def s_variables(self, node: Any) -> None:  # `A=1 B=2` on one line
        for child in node.children:
            if child.type == "variable_assignment":
                self.s_assignment(child)

    def s_unset(self, node: Any) -> None:
        for child in node.children[1:]:
            self.vars.pop(child.text.decode(), None)

    def s_list(self, node: Any) -> None:
        """`a && b`, `a || b`: `b` runs when `a` is known to let it; otherwise it is read as conditional."""
        left, op, right = node.children[0], node.children[1].type, node.children[2]
        value = self.condition(left) if left.type in ("test_command", "negated_command", "list") else None
        if value is None:
            self.statement(left)
            if left.type not in ("test_command", "negated_command", "list"):
                value = True  # a command is taken to succeed: `cd dir && python3 ...`, `cmd || exit 1`
        if value is (op == "&&"):
            self.statement(right)
        elif value is None:
            self.conditions.append(f"after `{_first_line(left)}`")
            try:
                self.statement(right)
            finally:
                self.conditions.pop()

    def s_pipeline(self, node: Any) -> None:
        for child in node.children:
            if child.is_named:
                self.statement(child)

    def s_redirected(self, node: Any) -> None:
        body = node.child_by_field_name("body")
        if any(c.type == "heredoc_redirect" for c in node.children):
            if body is not None and body.type == "command" and _command_name(body) == "cat":
                self.note(node, "here-document not evaluated")
                return
            self.note(node, "here-document input not evaluated")
        if body is not None:
            self.statement(body)

    def s_subshell(self, node: Any) -> None:
        saved = (dict(self.vars), self.cwd)
        self.block(node.children)
        self.vars, self.cwd = saved

    def s_compound(self, node: Any) -> None:
        self.block(node.children)

    def s_function(self, node: Any) -> None:
        name = node.child_by_field_name("name")
        body = node.child_by_field_name("body")
        if name is not None and body is not None:
            self.functions[name.text.decode()] = (body, self.file)

    def s_negated(self, node: Any) -> None:
        self.block(node.children)

    def s_test(self, node: Any) -> None:
        return  # a bare `[ ... ]` changes nothing

    # -- control flow ------------------------------------------------------------------------

    def s_if(self, node: Any) -> None:
        branches: list[tuple[Any | None, list[Any]]] = []
        condition: Any = None
        body: list[Any] = []
        for child in node.children:
            if child.type in ("if", "then", "fi", ";", "\n"):
                continue
            if child.type in ("elif_clause", "else_clause"):
                continue
            if condition is None:
                condition = child
            else:
                body.append(child)
        branches.append((condition, body))
        for clause in node.children:
            if clause.type == "elif_clause":
                parts = [c for c in clause.children if c.is_named]
                branches.append((parts[0] if parts else None, parts[1:]))
            elif clause.type == "else_clause":
                branches.append((None, [c for c in clause.children if c.is_named]))
        self.choose(node, [(c, b, _first_line(c) if c is not None else "else") for c, b in branches])

    def choose(self, node: Any, branches: list[tuple[Any | None, list[Any], str]]) -> None:
        """Take the branch whose condition resolves true; when one does not resolve, read all."""
        open_branches: list[tuple[list[Any], str]] = []
        for condition, body, label in branches:
            value = True if condition is None else self.condition(condition)
            if value is False:
                continue
            if value is True and not open_branches:
                self.block(body)
                return
            open_branches.append((body, label))
            if value is True:
                break
        if not open_branches:
            return
        else_taken = len(open_branches) < len(branches) or branches[-1][0] is None
        if not else_taken:
            open_branches.append(([], "no branch"))
        self.note(node, f"condition `{_first_line(node)}` not evaluated: every branch read")
        self.fork(open_branches)

    def fork(self, branches: list[tuple[list[Any], str]]) -> None:
        start_vars, start_cwd = dict(self.vars), self.cwd
        outcomes: list[dict[str, Var]] = []
        for body, label in branches:
            self.vars, self.cwd = dict(start_vars), start_cwd
            self.conditions.append(label)
            try:
                self.block(body)
            finally:
                self.conditions.pop()
            outcomes.append(self.vars)
        merged: dict[str, Var] = {}
        for name in dict.fromkeys(n for o in outcomes for n in o):
            values = [o.get(name) for o in outcomes]
            first = next(v for v in values if v is not None)
            texts = tuple(dict.fromkeys("<unset>" if v is None else v.text for v in values))
            merged[name] = first if len(texts) == 1 else replace(first, alternatives=texts)
        self.vars, self.cwd = merged, start_cwd

    def s_case(self, node: Any) -> None:
        value_node = node.child_by_field_name("value")
        subject = self.join(value_node) if value_node is not None else None
        branches: list[tuple[Any | None, list[Any], str]] = []
        for item in node.children:
            if item.type != "case_item":
                continue
            patterns = [c for c in item.children if c.type not in (")", ";;", ";&", ";;&", "|") and c.is_named]
            values = item.children_by_field_name("value")
            pattern_nodes = values or patterns[:1]
            body = [c for c in item.children if c.is_named and c not in pattern_nodes]
            label = "case " + "|".join(p.text.decode() for p in pattern_nodes)
            if subject is None or not subject.exact:
                branches.append((_Unknown, body, label))
                continue
            matched = any(fnmatch.fnmatchcase(subject.text, self.join(p).text) for p in pattern_nodes)
            branches.append((_True if matched else _False, body, label))
        self.choose(node, branches)

    def s_for(self, node: Any) -> None:
        variable = node.child_by_field_name("variable")
        body = node.child_by_field_name("body")
        values = node.children_by_field_name("value")
        if variable is None or body is None:
            self.note(node, "loop not evaluated")
            return
        items = [f for v in values for f in self.word(v)] if values else list(self.positional)
        if any(not f.exact for f in items) or len(items) > MAX_LOOP:
            self.note(node, "loop over values not known before the run: not evaluated")
            return
        for item in items:
            self.vars[variable.text.decode()] = Var((item,), origin=self.here(node))
            self.block(body.children)

    def s_loop(self, node: Any) -> None:
        self.note(node, f"`{_first_line(node)}` loop not evaluated")

    def condition(self, node: Any) -> bool | None:
        if node is _True:
            return True
        if node is _False:
            return False
        if node is _Unknown:
            return None
        kind = node.type
        if kind == "test_command":
            inner = [c for c in node.children if c.is_named]
            return self.test(inner[0]) if len(inner) == 1 else None
        if kind == "list":
            parts = [c for c in node.children]
            left, op, right = parts[0], parts[1].type, parts[2]
            a = self.condition(left)
            if op == "&&":
                return False if a is False else (self.condition(right) if a else None)
            if op == "||":
                return True if a is True else (self.condition(right) if a is False else None)
            return None
        if kind == "negated_command":
            inner = [c for c in node.children if c.is_named]
            value = self.condition(inner[0]) if inner else None
            return None if value is None else not value
        if kind == "command":
            name = _command_name(node)
            if name in ("true", ":"):
                return True
            if name == "false":
                return False
            if name in ("test", "["):
                return None
            return None
        return None

    def test(self, node: Any) -> bool | None:
        kind = node.type
        if kind == "parenthesized_expression":
            inner = [c for c in node.children if c.is_named]
            return self.test(inner[0]) if inner else None
        if kind == "unary_expression":
            op = node.children[0].text.decode()
            operand = [c for c in node.children if c.is_named]
            if op == "!":
                truth = self.test(operand[-1]) if operand else None
                return None if truth is None else not truth
            word = self.join(operand[-1]) if operand else None
            if word is None or not word.exact:
                return None
            if op == "-z":
                return word.text == ""
            if op == "-n":
                return word.text != ""
            tests = {"-f": Path.is_file, "-d": Path.is_dir, "-e": Path.exists, "-r": Path.exists}
            target = self.path_of(word.text)
            if op in tests and target is not None:
                return bool(tests[op](target))  # the files beside the script, as bash sees them here
            return None
        if kind == "binary_expression":
            left, op_node, right = node.children[0], node.children[1], node.children[2]
            op = op_node.text.decode()
            if op in ("&&", "-a", "||", "-o"):
                a, b = self.test(left), self.test(right)
                if op in ("&&", "-a"):
                    return False if False in (a, b) else (None if None in (a, b) else True)
                return True if True in (a, b) else (None if None in (a, b) else False)
            lhs, rhs = self.join(left), self.join(right)
            if not (lhs.exact and rhs.exact):
                return None
            if op in ("=", "=="):
                return self.matches(node, lhs.text, rhs.text)
            if op == "!=":
                return not self.matches(node, lhs.text, rhs.text)
            if op == "=~":
                try:
                    return re.search(rhs.text, lhs.text) is not None
                except re.error:
                    return None
            numeric = {"-eq": operator.eq, "-ne": operator.ne, "-lt": operator.lt, "-le": operator.le}
            numeric |= {"-gt": operator.gt, "-ge": operator.ge}
            if op in numeric:
                try:
                    return bool(numeric[op](int(lhs.text), int(rhs.text)))
                except ValueError:
                    return None
            return None
        if kind in ("word", "string", "raw_string", "simple_expansion", "expansion", "concatenation"):
            joined = self.join(node)
            return (joined.text != "") if joined.exact else None
        return None

    def matches(self, node: Any, text: str, pattern: str) -> bool:
        """`==` in `[[ ]]` matches a glob pattern; in `[ ]` it compares strings."""
        while node is not None and node.type != "test_command":
            node = node.parent
        double = node is not None and node.children[0].type == "[["
        return fnmatch.fnmatchcase(text, pattern) if double else text == pattern

    # -- commands ----------------------------------------------------------------------------

    def s_command(self, node: Any) -> None:
        prefix: dict[str, Field] = {}
        argv: list[Field] = []
        args_end = node.start_byte
        for child in node.children:
            if child.type == "variable_assignment":
                name = child.child_by_field_name("name")
                value = child.child_by_field_name("value")
                if name is not None:
                    prefix[name.text.decode()] = (
                        self.join(value) if value is not None else Field("", self.file, self.line(child))
                    )
            elif child.type == "command_name":
                argv.extend(self.word(child.children[0]) if child.children else [])
                args_end = child.end_byte
            elif child.is_named and child.type not in ("file_redirect", "herestring_redirect", "comment"):
                argv.extend(self.word(child))
                args_end = child.end_byte
        if not argv:
            return
        name = argv[0].text
        builtin = _BUILTINS.get(name)
        if builtin is not None and argv[0].exact:
            builtin(self, node, argv[1:])
            return
        if name in self.functions and argv[0].exact:
            self.call(node, name, argv[1:])
            return
        env = {n: v.items[0] if v.items else Field("", self.file, 0) for n, v in self.vars.items() if v.exported}
        env.update(prefix)
        if name in ("bash", "sh") and len(argv) > 1 and argv[1].exact and not argv[1].text.startswith("-"):
            target = self.path_of(argv[1].text)
            if target is not None and target.is_file():
                self.subscript(target, argv[2:], env)
                return
        self.reading.runs.append(
            Run(
                argv=argv,
                env=env,
                file=self.file,
                line=self.line(node),
                start_byte=node.start_byte,
                end_byte=node.end_byte,
                args_end_byte=args_end,
                cwd=self.cwd,
                conditions=tuple(self.conditions),
                functions=tuple(self.call_stack),
            )
        )

    def call(self, node: Any, name: str, args: list[Field]) -> None:
        if len(self.call_stack) >= MAX_DEPTH:
            self.note(node, f"function {name} calls itself {MAX_DEPTH} deep: not evaluated further")
            return
        body, file = self.functions[name]
        saved = (self.positional, self.file, self.source)
        self.positional, self.file = args, file
        self.call_stack.append(name)
        self.locals.append({})
        try:
            self.statement(body)
        except _Return:
            pass
        finally:
            for var, old in self.locals.pop().items():
                if old is None:
                    self.vars.pop(var, None)
                else:
                    self.vars[var] = old
            self.call_stack.pop()
            self.positional, self.file, self.source = saved

    def subscript(self, path: Path, args: list[Field], env: dict[str, Field]) -> None:
        """`bash other.sh args`: a new shell that sees only the exported variables."""
        saved = (self.vars, self.positional, self.functions)
        self.vars = {n: Var((f,), exported=True, origin=f.source) for n, f in env.items()}
        self.positional, self.functions = args, {}
        try:
            self.run_file(path.absolute(), is_script=True)
        finally:
            self.vars, self.positional, self.functions = saved

    def path_of(self, text: str) -> Path | None:
        if not text:
            return None
        path = Path(os.path.expanduser(text))
        return path if path.is_absolute() else self.cwd / path

    def b_source(self, node: Any, args: list[Field]) -> None:
        if not args or not args[0].exact:
            self.note(node, "`source` of a file not known before the run")
            return
        target = self.path_of(args[0].text)
        if (target is None or not target.is_file()) and self.conditions:
            self.note(node, f"sources {args[0].text}, which does not exist (under a condition)")
            return
        if target is None or not target.is_file():
            raise RefusedError(f"{self.file}:{self.line(node)}: sources {args[0].text}, which does not exist")
        saved = self.positional
        if len(args) > 1:
            self.positional = args[1:]
        try:
            self.run_file(target.absolute())
        finally:
            self.positional = saved

    def b_cd(self, node: Any, args: list[Field]) -> None:
        if not args:
            self.cwd = Path(os.path.expanduser("~"))
        elif args[0].exact and args[0].text != "-":
            target = self.path_of(args[0].text)
            if target is not None:
                self.cwd = Path(os.path.normpath(target))
        else:
            self.note(node, "`cd` to a directory not known before the run")

    def b_set(self, node: Any, args: list[Field]) -> None:
        if args and args[0].text == "--":
            self.positional = args[1:]

    def b_shift(self, node: Any, args: list[Field]) -> None:
        count = int(args[0].text) if args and args[0].text.isdigit() else 1
        self.positional = self.positional[count:]

    def b_exit(self, node: Any, args: list[Field]) -> None:
        if not self.conditions:
            raise _Exit

    def b_return(self, node: Any, args: list[Field]) -> None:
        if self.call_stack and not self.conditions:
            raise _Return

    def b_ignore(self, node: Any, args: list[Field]) -> None:
        return

    def b_printf(self, node: Any, args: list[Field]) -> None:
        """`printf -v NAME FORMAT ...` sets NAME: not evaluated, so NAME is marked unresolved, not left unset."""
        texts = [a.text for a in args]
        if "-v" in texts and texts.index("-v") + 1 < len(texts):
            name = texts[texts.index("-v") + 1]
            what = f"{self.here(node)}: `printf -v {name}` not evaluated"
            self.note(node, f"`printf -v {name}` not evaluated")
            self.vars[name] = Var(
                (Field(_opaque(f"$({name})"), self.file, self.line(node), (what,)),), origin=self.here(node)
            )

    def b_eval(self, node: Any, args: list[Field]) -> None:
        self.note(node, "`eval` not evaluated")

    # -- words -------------------------------------------------------------------------------

    def words_of(self, group: list[Any]) -> list[Field]:
        """One element's fields; the grammar's split of `[0]*$N+[1]` (two nodes, one bash word) is kept
        as written and reported unresolved, never read as two words."""
        if len(group) == 1:
            return self.word(group[0])
        text = self.source[group[0].start_byte : group[-1].end_byte].decode("utf-8", "replace")
        what = f"{self.here(group[0])}: `{text[:60]}` not understood by the reader"
        self.note(group[0], f"`{text[:60]}` not understood by the reader")
        return [Field(text, self.file, self.line(group[0]), (what,))]

    def word(self, node: Any) -> list[Field]:
        """The fields a word expands to (word splitting and "${A[@]}" included)."""
        segs = self.segs(node, quoted=False)
        fields: list[Field] = []
        text: list[str] = []
        started = False
        origin: Field | None = None
        unresolved: list[str] = []
        via: list[str] = []

        def flush() -> None:
            nonlocal text, started, origin, unresolved, via
            if started:
                where = origin or Field("", self.file, self.line(node))
                fields.append(Field("".join(text), where.file, where.line, tuple(unresolved), tuple(via)))
            text, started, origin, unresolved, via = [], False, None, [], []

        for seg in segs:
            if seg is _BREAK:
                flush()
                continue
            pieces = _SPLIT.split(seg.text) if seg.split else [seg.text]
            for index, piece in enumerate(pieces):
                if index:
                    flush()
                if piece or not seg.split:
                    text.append(piece)
                    started = True
                    origin = origin or seg.origin
                    unresolved.extend(seg.unresolved)
                    via.extend(seg.via)
        flush()
        return fields

    def join(self, node: Any) -> Field:
        """A word read as one string, as in an assignment or `case` (no splitting)."""
        segs = [s for s in self.segs(node, quoted=True) if s is not _BREAK]
        origin = next((s.origin for s in segs if s.origin), None) or Field("", self.file, self.line(node))
        return Field(
            "".join(s.text for s in segs),
            origin.file,
            origin.line,
            tuple(u for s in segs for u in s.unresolved),
            tuple(v for s in segs for v in s.via),
        )

    def segs(self, node: Any, quoted: bool) -> list[_Seg]:
        kind = node.type
        if kind in ("word", "number", "extglob_pattern", "regex", "variable_name"):  # a name: `${V:-a=b}`'s `a`
            text = node.text.decode()
            if not quoted:
                text = re.sub(r"\\(.)", r"\1", text, flags=re.S)
                if text.startswith("~") and (len(text) == 1 or text[1] == "/"):
                    text = os.path.expanduser("~") + text[1:]
            return [_Seg(text)]
        if kind == "string_content":
            text = node.text.decode().replace("\\\n", "")  # a continued line inside "..."
            return [_Seg(re.sub(r"\\([$`\"\\])", r"\1", text))]
        if kind == "raw_string":
            return [_Seg(node.text.decode()[1:-1])]
        if kind == "ansi_c_string":
            body = node.text.decode()[2:-1]
            try:
                return [_Seg(body.encode("latin-1", "backslashreplace").decode("unicode_escape"))]
            except UnicodeDecodeError:
                return [_Seg(body)]
        if kind == "string":
            inner = [c for c in node.children if c.is_named]
            if len(inner) == 1 and _is_at(inner[0]):
                return self.segs(inner[0], quoted=True)
            out: list[_Seg] = [_Seg("")]
            for child in inner:
                out.extend(self.segs(child, quoted=True))
            return out
        if kind == "concatenation":
            return [s for c in node.children for s in self.segs(c, quoted)]
        if kind in ("simple_expansion", "expansion"):
            return self.expansion(node, quoted)
        if kind == "command_substitution":
            return [self.substitution(node)]
        if kind == "arithmetic_expansion":
            return [self.arithmetic(node)]
        if kind == "array":
            return [s for c in node.children if c.is_named for s in ([*self.segs(c, quoted), _BREAK])]
        text = node.text.decode()
        return [_Seg(_opaque(text), unresolved=(f"{self.here(node)}: `{text[:60]}` not evaluated",))]

    def lookup(self, name: str) -> Var | None:
        if name.isdigit():
            index = int(name)
            if index == 0:
                return Var((Field(str(self.script), self.script, 0),))
            if index <= len(self.positional):
                return Var((self.positional[index - 1],))
            return None
        if name in ("@", "*"):
            return Var(tuple(self.positional), array=True)
        if name == "#":
            return Var((Field(str(len(self.positional)), self.file, 0),))
        if name == "BASH_SOURCE" and name not in self.vars:  # the file being read, then the ones sourcing it
            return Var(tuple(Field(str(p), p, 0) for p in reversed(self.stack)), array=True)
        return self.vars.get(name)

    def expansion(self, node: Any, quoted: bool) -> list[_Seg]:
        children = [c for c in node.children if c.type not in ("$", "${", "}")]
        if not children:
            return [_Seg("$")]
        length = children[0].type == "#" and len(children) > 1
        if length:
            children = children[1:]
        head = children[0]
        if head.type == "!":
            return [_Seg(node.text.decode(), unresolved=(f"{self.here(node)}: indirect `{node.text.decode()}`",))]
        index: str | None = None
        if head.type == "subscript":
            name_node = head.child_by_field_name("name")
            index_node = head.child_by_field_name("index")
            name = name_node.text.decode() if name_node else ""
            index = self.join(index_node).text if index_node is not None else None
        else:
            name = head.text.decode()
        var = self.lookup(name)
        rest = children[1:]
        op = rest[0].text.decode() if rest and not rest[0].is_named else None
        operand = rest[1:] if op is not None else rest
        via = (f"{name} ({var.origin})",) if var is not None and var.origin else ()
        unresolved: tuple[str, ...] = ()
        if var is not None and var.alternatives:
            unresolved = (f"{self.here(node)}: ${name} differs between branches ({' | '.join(var.alternatives)})",)
        if var is not None and any(not f.exact for f in var.items):
            unresolved += tuple(u for f in var.items for u in f.unresolved)

        items: list[Field]
        if var is None:
            items = []
        elif index is None or (index == "0" and not var.array):
            items = list(var.items[:1]) if var.array and name not in ("@", "*") else list(var.items)
        elif index in ("@", "*"):
            items = list(var.items)
        elif index.isdigit():
            items = [var.items[int(index)]] if int(index) < len(var.items) else []
        else:
            items = []
        is_set = var is not None and (not var.array or bool(items) or index is not None)
        value = " ".join(f.text for f in items)
        if length:
            return [_Seg(str(len(items) if index in ("@", "*") else len(value)), via=via)]
        at = (index in ("@", "*") or name in ("@", "*")) and (index == "@" or name == "@" or not quoted)

        if op in (":-", "-", ":=", "=", ":?", "?", ":+", "+"):
            empty = not value if op.startswith(":") else not is_set
            if op in (":+", "+"):
                return self.operand(operand, quoted, via) if not empty else [_Seg("", via=via)]
            if empty:
                if op in (":=", "="):
                    default = self.operand_field(operand)
                    self.vars[name] = Var((default,), origin=self.here(node))
                return self.operand(operand, quoted, via)
            op = None
        if op in ("%", "%%", "#", "##", "/", "//", "/#", "/%", ",", ",,", "^", "^^"):
            value = self.transform(op, value, operand)
            return [_Seg(value, split=not quoted, unresolved=unresolved, via=via)]
        if op == ":":  # ${V:offset:length}, ${@:offset:length}, ${A[@]:offset:length}
            bounds = self.slice_bounds(operand)
            if bounds is not None:
                if at or (var is not None and var.array and index in ("@", "*")) or name in ("@", "*"):
                    if name in ("@", "*"):  # positional slices count $0 as the first: ${@:2} starts at $2
                        zero = self.lookup("0")
                        items = _sliced(list(zero.items[:1] if zero is not None else ()) + items, *bounds)
                    else:
                        items = _sliced(items, *bounds)
                    value = " ".join(f.text for f in items)
                else:
                    value = "".join(_sliced(list(value), *bounds))
                    return [_Seg(value, split=not quoted, unresolved=unresolved, via=via)]
                op = None
        if op is not None:
            return [_Seg(node.text.decode(), unresolved=(f"{self.here(node)}: `{node.text.decode()}` not evaluated",))]
        if at and len(items) != 1:
            out: list[_Seg] = []
            for i, item in enumerate(items):
                if i:
                    out.append(_BREAK)
                out.append(
                    _Seg(item.text, split=not quoted, origin=item, unresolved=item.unresolved, via=item.via + via)
                )
            return out
        whole_word = node.parent is not None and node.parent.type not in ("concatenation", "string")
        origin = items[0] if len(items) == 1 and var is not None and (var.array or whole_word) else None
        return [_Seg(value, split=not quoted, origin=origin, unresolved=unresolved, via=via)]

    def slice_bounds(self, nodes: list[Any]) -> tuple[int, int | None] | None:
        """The offset and length of a `${V:offset:length}` slice, when both are plain numbers."""
        texts = [self.join(n).text.strip() for n in nodes if n.is_named]
        try:
            numbers = [int(text) for text in texts]
        except ValueError:
            return None
        if not 1 <= len(numbers) <= 2:
            return None
        return numbers[0], numbers[1] if len(numbers) == 2 else None

    def operand(self, nodes: list[Any], quoted: bool, via: tuple[str, ...]) -> list[_Seg]:
        out: list[_Seg] = []
        for child in nodes:
            out.extend(self.segs(child, quoted))
        return out or [_Seg("", via=via)]

    def operand_field(self, nodes: list[Any]) -> Field:
        segs = [s for c in nodes for s in self.segs(c, True) if s is not _BREAK]
        line = self.line(nodes[0]) if nodes else 0
        return Field("".join(s.text for s in segs), self.file, line, tuple(u for s in segs for u in s.unresolved))

    def transform(self, op: str, value: str, operand: list[Any]) -> str:
        if op in (",", ",,"):
            return value.lower() if op == ",," else value[:1].lower() + value[1:]
        if op in ("^", "^^"):
            return value.upper() if op == "^^" else value[:1].upper() + value[1:]
        texts = [self.join(o).text for o in operand if o.is_named]
        pattern = texts[0] if texts else ""
        if op in ("%", "%%"):
            cuts = [i for i in range(len(value), -1, -1) if fnmatch.fnmatchcase(value[i:], pattern)]
            if not cuts:
                return value
            return value[: (min(cuts) if op == "%%" else max(cuts))]
        if op in ("#", "##"):
            cuts = [i for i in range(len(value) + 1) if fnmatch.fnmatchcase(value[:i], pattern)]
            if not cuts:
                return value
            return value[(max(cuts) if op == "##" else min(cuts)) :]
        replacement = texts[1] if len(texts) > 1 else ""
        regex = fnmatch.translate(pattern).removesuffix(r"\Z").removeprefix("(?s:").removesuffix(")")
        try:
            if op == "/#":
                return re.sub("^(?:" + regex + ")", replacement, value, count=1)
            if op == "/%":
                return re.sub("(?:" + regex + ")$", replacement, value, count=1)
            return re.sub(regex, lambda _: replacement, value, count=0 if op == "//" else 1)
        except re.error:
            return value

    def substitution(self, node: Any) -> _Seg:
        """`$(...)`: the few forms whose output is known without running anything."""
        text = node.text.decode()
        body = [c for c in node.children if c.is_named]
        saved = self.cwd  # $( ) runs in a subshell
        try:
            out, _ = self.captured(body[0]) if len(body) == 1 else (None, None)
        finally:
            self.cwd = saved
        if out is None:
            return _Seg(_opaque(text), unresolved=(f"{self.here(node)}: `{text[:60]}` not evaluated",))
        via = (f"{PROBE_VIA} {self.python}",) if "import " in text else ()
        return _Seg(out.rstrip("\n"), via=via)

    def captured(self, node: Any) -> tuple[str | None, bool | None]:
        """(output, success) of a command in `$(...)`; (None, None) when only a run would know."""
        kind = node.type
        if kind == "redirected_statement":  # `cmd 2>/dev/null`: the output we read is stdout
            body = node.child_by_field_name("body")
            redirects = [c.text.decode() for c in node.children if c.type == "file_redirect"]
            if body is None or any(not re.fullmatch(r"(2|&|1)?>\s*/dev/null", r) for r in redirects):
                return None, None
            out, ok = self.captured(body)
            if out is not None and any(re.fullmatch(r"(&|1)?>\s*/dev/null", r) for r in redirects):
                out = ""  # stdout discarded (`cd dir &>/dev/null`)
            return out, ok
        if kind == "list":
            left, op, right = node.children[0], node.children[1].type, node.children[2]
            out, ok = self.captured(left)
            if out is None or ok is None:
                return None, None
            if ok is (op == "||"):
                return out, ok
            more, ok = self.captured(right)
            return (None, None) if more is None else (out + more, ok)
        if kind != "command":
            return None, None
        words = [c.children[0] if c.type == "command_name" else c for c in node.children if c.is_named]
        argv = [f for w in words for f in self.word(w)]
        if not argv or any(not f.exact for f in argv):
            return None, None
        name, args = argv[0].text, [f.text for f in argv[1:]]
        if name in ("cd", "dirname", "basename") and args[:1] == ["--"]:
            args = args[1:]  # end of options (`dirname -- "$0"`)
        if name == "pwd":
            return str(self.cwd) + "\n", True
        if name == "cd" and len(args) <= 1:
            target = self.path_of(args[0]) if args else Path(os.path.expanduser("~"))
            if target is None:
                return None, None
            self.cwd = Path(os.path.normpath(target))
            return "", True
        if name == "dirname" and len(args) == 1:
            return (os.path.dirname(args[0].rstrip("/")) or ".") + "\n", True
        if name == "basename" and 1 <= len(args) <= 2:
            base = os.path.basename(args[0].rstrip("/"))
            return (base.removesuffix(args[1]) if len(args) == 2 and base != args[1] else base) + "\n", True
        if name in ("realpath", "readlink") and args and args[-1] and (name == "realpath" or args[0] in ("-f", "-m")):
            target = self.path_of(args[-1])
            return (None, None) if target is None else (os.path.realpath(target) + "\n", True)
        if name == "echo":
            newline = "" if "-n" in args else "\n"
            return " ".join(a for a in args if a not in ("-n", "-e")) + newline, True
        if name in ("true", "false"):
            return "", name == "true"
        probe = _import_probe(name, args, self.python)
        if probe is not None:
            return "", probe
        return None, None

    def arithmetic(self, node: Any) -> _Seg:
        text = node.text.decode()
        expression = text[3:-2]

        def value_of(m: re.Match[str]) -> str:
            var = self.lookup(m.group(1) or m.group(2))
            return var.text if var is not None and var.text.strip() else "0"

        substituted = re.sub(r"\$\{?(\w+)\}?|\b([A-Za-z_]\w*)\b", value_of, expression)
        result = _arith(substituted)
        if result is None:
            return _Seg(_opaque(text), unresolved=(f"{self.here(node)}: `{text}` not evaluated",))
        return _Seg(str(result))


def _glued(children: Any) -> list[list[Any]]:
    """Array elements, where nodes with no blank between them (tree-sitter ends one at a bare `$`) form one."""
    groups: list[list[Any]] = []
    for c in children:
        if not c.is_named or c.type == "comment":
            continue
        previous = groups[-1][-1] if groups else None
        if previous is not None and previous.end_byte == c.start_byte and previous.text.endswith(b"$"):
            groups[-1].append(c)
        else:
            groups.append([c])
    return groups


def _without_comments(tree: Any, data: bytes) -> str:
    text = bytearray(data)
    stack = [tree.root_node]
    while stack:
        node = stack.pop()
        if node.type == "comment":
            text[node.start_byte : node.end_byte] = b" " * (node.end_byte - node.start_byte)
        else:
            stack.extend(node.children)
    return text.decode("utf-8", "replace")


def _bash_verdict(path: Path) -> str | None:
    """None when `bash -n` (bash's own parser, which runs nothing) accepts the file, else its message."""
    import shutil
    import subprocess

    bash = shutil.which("bash")
    if bash is None:
        return "the grammar refuses it and bash is not there to ask"
    try:
        proc = subprocess.run([bash, "-n", str(path)], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bash -n could not check it ({exc})"
    if proc.returncode == 0:
        return None
    lines = proc.stderr.decode("utf-8", "replace").strip().splitlines()
    return lines[0].removeprefix(f"{path}: ") if lines else f"bash -n exit {proc.returncode}"


PROBE_VIA = "import probe answered by"


def _import_probe(name: str, args: list[str], python: str) -> bool | None:
    """`python3 -c 'import torch_npu'`: whether `python` finds the module (found, not imported)."""
    if not re.search(r"(^|/)python[\d.]*$", name) or len(args) != 2 or args[0] != "-c":
        return None
    m = re.fullmatch(r"\s*import\s+([A-Za-z_][\w.]*)\s*;?\s*", args[1])
    if not m:
        return None
    return finds(python, m.group(1).split(".")[0])


def _opaque(text: str) -> str:
    """Text kept as written for what was not evaluated: one word (no-break spaces), as its value would be."""
    return re.sub(r"\s+", "\u00a0", text)


def _is_at(node: Any) -> bool:
    """`$@`, `${@...}`, `${A[@]...}` (slices and defaults included): inside quotes, one word per item, so
    none where there is none (`"${@:2}"` with one argument), as bash gives; `"$*"` is always one word."""
    if node.type not in ("simple_expansion", "expansion"):
        return False
    head = next((c for c in node.children if c.type not in ("$", "${")), None)
    if head is None:
        return False
    if head.type == "special_variable_name":
        return bool(head.text == b"@")
    index = head.child_by_field_name("index") if head.type == "subscript" else None
    return index is not None and index.text == b"@"


def _first_line(node: Any) -> str:
    return str(node.text.decode("utf-8", "replace").splitlines()[0][:60] if node.text else node.type)


def _command_name(node: Any) -> str:
    name = node.child_by_field_name("name")
    return name.text.decode() if name is not None else ""


_ARITH_OPS: dict[type, Callable[..., int]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def _arith(expression: str) -> int | None:
    """Integer arithmetic as bash does it (`/` truncates), nothing else."""
    try:
        tree = ast.parse(expression.replace("/", "//").strip() or "0", mode="eval")
    except SyntaxError:
        return None

    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITH_OPS:
            return _ARITH_OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _ARITH_OPS:
            return _ARITH_OPS[type(node.op)](walk(node.operand))
        raise ValueError(node)

    try:
        return walk(tree.body)
    except (ValueError, ZeroDivisionError):
        return None


class _Sentinel:
    def __init__(self, name: str) -> None:
        self.name = name
        self.type = name
        self.text = name.encode()


_True, _False, _Unknown = _Sentinel("true"), _Sentinel("false"), _Sentinel("unknown")

_STATEMENTS: dict[str, Callable[[_Evaluator, Any], None]] = {
    "program": _Evaluator.s_program,
    "variable_assignment": _Evaluator.s_assignment,
    "variable_assignments": _Evaluator.s_variables,
    "declaration_command": _Evaluator.s_declaration,
    "unset_command": _Evaluator.s_unset,
    "command": _Evaluator.s_command,
    "list": _Evaluator.s_list,
    "pipeline": _Evaluator.s_pipeline,
    "redirected_statement": _Evaluator.s_redirected,
    "subshell": _Evaluator.s_subshell,
    "compound_statement": _Evaluator.s_compound,
    "function_definition": _Evaluator.s_function,
    "negated_command": _Evaluator.s_negated,
    "test_command": _Evaluator.s_test,
    "if_statement": _Evaluator.s_if,
    "case_statement": _Evaluator.s_case,
    "for_statement": _Evaluator.s_for,
    "c_style_for_statement": _Evaluator.s_loop,
    "while_statement": _Evaluator.s_loop,
}

_BUILTINS: dict[str, Callable[[_Evaluator, Any, list[Field]], None]] = {
    "source": _Evaluator.b_source,
    ".": _Evaluator.b_source,
    "cd": _Evaluator.b_cd,
    "pushd": _Evaluator.b_cd,
    "set": _Evaluator.b_set,
    "shift": _Evaluator.b_shift,
    "exit": _Evaluator.b_exit,
    "return": _Evaluator.b_return,
    "eval": _Evaluator.b_eval,
    "printf": _Evaluator.b_printf,
    **{name: _Evaluator.b_ignore for name in ("echo", "mkdir", "popd", "shopt", "trap", "ulimit", ":")},
}


def _sliced(items: list[Any], offset: int, length: int | None) -> list[Any]:
    """bash's `${X:offset:length}` on a list: a negative offset counts from the end, a negative length
    is an end counted from the end."""
    start = max(len(items) + offset, 0) if offset < 0 else offset
    if length is None:
        return items[start:]
    end = len(items) + length if length < 0 else start + length
    return items[start:end]
