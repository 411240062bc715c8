"""What the reader finds: each argument with where it was written (`Field`), the variables (`Var`), the commands
the script would run (`Run`), what it could not evaluate (`Unresolved`), and the whole `Reading`; the pieces a word
expands to (`Seg`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

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


SPLIT = re.compile(r"[ \t\n]+")


@dataclass
class Seg:
    text: str
    split: bool = False  # unquoted expansion: subject to word splitting
    origin: Field | None = None  # an array element keeps where it was written
    unresolved: tuple[str, ...] = ()
    via: tuple[str, ...] = ()


BREAK = Seg("\0break")  # a field boundary ("${A[@]}")


class ExitScript(Exception):
    """`exit` outside a condition: the script ends here."""


class ReturnFromFunction(Exception):
    """`return` in a function outside a condition."""
