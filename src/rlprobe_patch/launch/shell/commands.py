"""Simple commands: the ones the script would run (`Run`, with their environment and where they run), its own
functions called, `bash other.sh` read as a new shell, and the builtins that change what follows (`source`, `cd`,
`set --`, `shift`, `exit`, `return`, `printf -v`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rlprobe_patch.base.errors import RefusedError
from rlprobe_patch.launch.shell.fields import MAX_DEPTH, ExitScript, Field, ReturnFromFunction, Run, Var
from rlprobe_patch.launch.shell.grammar import opaque
from rlprobe_patch.launch.shell.state import Evaluation

# a builtin's name -> the method that evaluates it
BUILTINS: dict[str, str] = {
    "source": "b_source",
    ".": "b_source",
    "cd": "b_cd",
    "pushd": "b_cd",
    "set": "b_set",
    "shift": "b_shift",
    "exit": "b_exit",
    "return": "b_return",
    "eval": "b_eval",
    "printf": "b_printf",
    **{name: "b_ignore" for name in ("echo", "mkdir", "popd", "shopt", "trap", "ulimit", ":")},
}


class Commands(Evaluation):
    """Simple commands, functions and builtins."""

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
        builtin = BUILTINS.get(name)
        if builtin is not None and argv[0].exact:
            getattr(self, builtin)(node, argv[1:])
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
        except ReturnFromFunction:
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
            raise ExitScript

    def b_return(self, node: Any, args: list[Field]) -> None:
        if self.call_stack and not self.conditions:
            raise ReturnFromFunction

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
                (Field(opaque(f"$({name})"), self.file, self.line(node), (what,)),), origin=self.here(node)
            )

    def b_eval(self, node: Any, args: list[Field]) -> None:
        self.note(node, "`eval` not evaluated")
