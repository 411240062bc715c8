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

    fields.py         what the reader finds (`Field`, `Var`, `Run`, `Unresolved`, `Reading`)
    grammar.py        the script parsed by tree-sitter-bash, and what is asked of its nodes
    state.py          the evaluator's state, and the calls its parts make on each other
    statements.py     statements: assignments, lists, pipelines, functions defined
    control.py        control flow: `if`, `case`, `for` and their conditions
    commands.py       simple commands, functions, builtins
    words.py          expansions
    substitutions.py  `$(...)` and `$((...))`
"""

from __future__ import annotations

import sys
from pathlib import Path

from rlprobe_patch.launch.shell.commands import Commands
from rlprobe_patch.launch.shell.control import Control
from rlprobe_patch.launch.shell.fields import Field, Probe, Reading, Run, Unresolved, Var
from rlprobe_patch.launch.shell.grammar import parse, read_text, syntax_errors
from rlprobe_patch.launch.shell.statements import Statements
from rlprobe_patch.launch.shell.substitutions import PROBE_VIA, Substitutions
from rlprobe_patch.launch.shell.words import Words

__all__ = [
    "PROBE_VIA",
    "Field",
    "Probe",
    "Reading",
    "Run",
    "Unresolved",
    "Var",
    "parse",
    "read_shell",
    "read_text",
    "syntax_errors",
]


class _Evaluator(Statements, Control, Commands, Words, Substitutions):
    """A script evaluated statically: its statements, control flow, commands, words and substitutions."""


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
