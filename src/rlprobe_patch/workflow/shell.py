"""Shell words with their place in the source: enough of POSIX sh for training launch scripts.

Training scripts are `bash` files that set a few variables, export switches and run one long
`python3 -m verl.trainer.main_ppo key=value ... \\` command. Reading them as words (quotes
removed, `\\<newline>` joined, comments dropped, `$VAR` / `${VAR:-default}` expanded from
earlier assignments) is what the skill's grep scripts could not do; keeping each word's span
lets `script` replace one override in a copy without disturbing anything else.

Not supported (left as written, marked unresolved): command substitution, arithmetic,
arrays, here-documents.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_SEPARATORS = ";&|"


@dataclass
class Word:
    """One shell word. `parts` keeps which pieces may be expanded (outside single quotes)."""

    raw: str
    start: int
    end: int
    line: int
    parts: list[tuple[str, bool]] = field(default_factory=list)
    text: str = ""  # after expansion
    unresolved: tuple[str, ...] = ()  # variables that had no value

    def expand(self, variables: dict[str, str]) -> None:
        out: list[str] = []
        missing: list[str] = []
        for piece, expandable in self.parts:
            out.append(expand_vars(piece, variables, missing) if expandable else piece)
        self.text = "".join(out)
        self.unresolved = tuple(missing)


@dataclass
class Command:
    words: list[Word]
    line: int

    @property
    def assignments(self) -> list[tuple[str, Word]]:
        """Leading `NAME=value` words (the environment of the command, or plain assignments)."""
        found = []
        for word in self.words:
            m = _ASSIGNMENT.match(word.text)
            if not m or (word.parts and not word.parts[0][1]):
                break
            found.append((m.group(1), word))
        return found

    @property
    def args(self) -> list[Word]:
        return self.words[len(self.assignments) :]


@dataclass
class Comment:
    text: str
    line: int


_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=", re.S)
_VAR = re.compile(r"\$(?:\{([^}]*)\}|([A-Za-z_][A-Za-z0-9_]*|[0-9@*#?]))")


def expand_vars(text: str, variables: dict[str, str], missing: list[str]) -> str:
    def sub(m: re.Match[str]) -> str:
        if m.group(2) is not None:
            name, op, default = m.group(2), None, ""
        else:
            inner = m.group(1)
            mm = re.match(r"^([A-Za-z_][A-Za-z0-9_]*|[0-9]+)(?:(:?[-=+?])(.*))?$", inner, re.S)
            if not mm:
                missing.append(inner)
                return m.group(0)
            name, op, default = mm.group(1), mm.group(2), mm.group(3) or ""
        value = variables.get(name)
        if (op in (":-", ":=") and not value) or (op in ("-", "=") and value is None):
            return expand_vars(default, variables, missing)
        if op in (":+", "+"):
            return expand_vars(default, variables, missing) if value else ""
        if value is None:
            missing.append(name)
            return m.group(0)
        return value

    return _VAR.sub(sub, text)


def tokenize(source: str) -> tuple[list[Command], list[Comment]]:
    """Split `source` into commands of words (unexpanded) and comments."""
    commands: list[Command] = []
    comments: list[Comment] = []
    words: list[Word] = []
    i, n = 0, len(source)
    line = 1
    current: Word | None = None

    def line_at(pos: int) -> int:
        return source.count("\n", 0, pos) + 1

    def finish_word(end: int) -> None:
        nonlocal current
        if current is not None:
            current.end = end
            current.raw = source[current.start : end]
            words.append(current)
            current = None

    def finish_command() -> None:
        nonlocal words
        if words:
            commands.append(Command(words, words[0].line))
        words = []

    def add(piece: str, expandable: bool, at: int) -> None:
        nonlocal current
        if current is None:
            current = Word("", at, at, line_at(at))
        if current.parts and current.parts[-1][1] == expandable:
            current.parts[-1] = (current.parts[-1][0] + piece, expandable)
        else:
            current.parts.append((piece, expandable))

    while i < n:
        c = source[i]
        if c == "\\" and i + 1 < n:
            if source[i + 1] == "\n":  # line continuation: removed, joins the lines
                i += 2
                continue
            add(source[i + 1], False, i)
            i += 2
            continue
        if c in " \t\r":
            finish_word(i)
            i += 1
            continue
        if c == "\n":
            finish_word(i)
            finish_command()
            line += 1
            i += 1
            continue
        if c == "#" and current is None:
            end = source.find("\n", i)
            end = n if end < 0 else end
            comments.append(Comment(source[i + 1 : end].strip(), line_at(i)))
            i = end
            continue
        if c in _SEPARATORS or (c in "()" and current is None):
            finish_word(i)
            finish_command()
            i += 1
            continue
        if c == "'":
            end = source.find("'", i + 1)
            end = n if end < 0 else end
            add(source[i + 1 : end], False, i)
            i = end + 1
            continue
        if c == '"':
            j = i + 1
            add("", True, i)  # an empty "" is still a word
            while j < n and source[j] != '"':
                if source[j] == "\\" and j + 1 < n and source[j + 1] in '"\\$`\n':
                    if source[j + 1] != "\n":
                        add(source[j + 1], source[j + 1] != "$", j)  # an escaped $ is literal
                    j += 2
                    continue
                add(source[j], True, j)
                j += 1
            i = j + 1
            continue
        if c == "$" and i + 1 < n and source[i + 1] in "({":
            close = ")" if source[i + 1] == "(" else "}"
            depth, j = 0, i + 1
            while j < n:
                if source[j] == source[i + 1]:
                    depth += 1
                elif source[j] == close:
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            add(source[i : j + 1], True, i)
            i = j + 1
            continue
        add(c, True, i)
        i += 1
    finish_word(n)
    finish_command()
    return commands, comments
