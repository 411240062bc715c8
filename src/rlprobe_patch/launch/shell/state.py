"""The evaluator's state (variables, functions, "$@", the directory, the files being read, the conditions it sits
under), the file it reads, and the calls its parts make on each other: `Statements`, `Control` (control flow),
`Commands` (simple commands, functions and builtins), `Words` (expansions) and `Substitutions` (`$(...)`, `$((...))`)
each define theirs; `evaluator.Evaluator` is all four."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from rlprobe_patch.base.errors import RefusedError
from rlprobe_patch.launch.shell.fields import MAX_DEPTH, ExitScript, Field, Reading, Seg, Unresolved, Var
from rlprobe_patch.launch.shell.grammar import bash_verdict, parse, read_text, syntax_errors, without_comments


class Evaluation:
    """One script's evaluation: its state and the file being read."""

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
            verdict = bash_verdict(path)
            if verdict is not None:  # bash's own words: they name the line bash stops at
                raise RefusedError(f"{path}: bash syntax error: {verdict}", hint="`bash -n` shows it too")
            for line, text in errors:  # valid bash that the grammar does not know: say what was skipped
                self.reading.unresolved.append(Unresolved(path, line, f"`{text}` not understood by the reader"))
        self.reading.code.append(without_comments(tree, data))
        saved = (self.file, self.source)
        self.file, self.source = path, data
        self.stack.append(path)
        self.reading.files.append(path)
        try:
            self.block(tree.root_node.children)
        except ExitScript:
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

    # -- defined by the parts (statements.py, control.py, commands.py, words.py, substitutions.py) ----------------

    def block(self, nodes: Any) -> None:
        raise NotImplementedError

    def statement(self, node: Any) -> None:
        raise NotImplementedError

    def condition(self, node: Any) -> bool | None:
        raise NotImplementedError

    def choose(self, node: Any, branches: list[tuple[Any | None, list[Any], str]]) -> None:
        raise NotImplementedError

    def path_of(self, text: str) -> Path | None:
        raise NotImplementedError

    def words_of(self, group: list[Any]) -> list[Field]:
        raise NotImplementedError

    def word(self, node: Any) -> list[Field]:
        raise NotImplementedError

    def join(self, node: Any) -> Field:
        raise NotImplementedError

    def segs(self, node: Any, quoted: bool) -> list[Seg]:
        raise NotImplementedError

    def lookup(self, name: str) -> Var | None:
        raise NotImplementedError

    def substitution(self, node: Any) -> Seg:
        raise NotImplementedError

    def arithmetic(self, node: Any) -> Seg:
        raise NotImplementedError
