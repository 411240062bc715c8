"""The commands rlprobe-patch prints for the user to run next, read as a user reads them (issues 29 and 42).

- `next: rlprobe-patch ...`, `confirm: rlprobe-patch ...` (after any indentation), and `hint: ..., run:
  rlprobe-patch ...`: the command on the line;
- `next: <what it is for>` followed by indented lines: each indented `rlprobe-patch ...` line is a command
  (the other indented lines are the user's own runs, `bash RUN.sh ...`, or a file to read);
- a `# ...` after a command is a comment, as the shell reads it.

A placeholder in a printed command is a word in capitals the same output defines: `(where RUN.sh is ...; DUMP
is ...)`; `definitions` finds them (the documentation's paragraphs "Where `/verl` is ...; ..." too).
"""

from __future__ import annotations

import re
import shlex

_PREFIXES = ("next: ", "confirm: ")
# "(where NAME is ...; ...)" in a printed line, "Where `NAME` is ...; ... ." opening a sentence of a page
_WHERE = re.compile(r"(?:\(where|\bWhere) (.+?)(?:\)(?:\s|$)|\.(?:\s|$)|$)")


def printed_commands(output: str) -> list[list[str]]:
    """The rlprobe-patch commands `output` tells the user to run, each as shell words, in order."""
    found: list[list[str]] = []
    in_next = False
    for line in output.splitlines():
        text = line.strip()
        if in_next and line[:1].isspace() and not text.startswith(_PREFIXES):
            if text.startswith("rlprobe-patch "):
                found.append(shlex.split(text, comments=True))
            continue
        in_next = False
        if text.startswith(_PREFIXES):
            rest = text.split(": ", 1)[1]
            if rest.startswith("rlprobe-patch "):
                found.append(shlex.split(rest, comments=True))
            in_next = text.startswith("next: ")
        elif text.startswith("hint: ") and ", run: rlprobe-patch " in text:
            found.append(shlex.split(text.split(", run: ", 1)[1], comments=True))
    return found


def printed_other(output: str) -> list[str]:
    """The indented lines under a `next:` that are no rlprobe-patch command: the user's own run, or a file."""
    found: list[str] = []
    in_next = False
    for line in output.splitlines():
        text = line.strip()
        if in_next and line[:1].isspace() and not text.startswith(_PREFIXES):
            if not text.startswith("rlprobe-patch "):
                found.append(text)
            continue
        in_next = text.startswith("next: ")
    return found


def definitions(text: str) -> set[str]:
    """The placeholders `text` defines: the first word of each `NAME is ...` clause after "where" (clauses
    separated by "; "), without backticks."""
    names = set()
    for match in _WHERE.finditer(" ".join(text.split())):
        for clause in match.group(1).split("; "):
            name, sep, _ = clause.partition(" is ")
            name = name.strip().strip("`")
            if sep and name and " " not in name:
                names.add(name)
    return names
