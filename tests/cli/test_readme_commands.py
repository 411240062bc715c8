"""The documented command lines match `--help` of every command.

The README's synopsis (between `<!-- options -->` markers in its Commands section) has one
entry per command with every option it takes; a command or option added to the CLI but not
there, or one there that the CLI lacks, fails here. Every example line (`rlprobe-patch CMD ...`
in a `sh` block) of the README, CONTRIBUTING.md and every page of the documentation site
(`docs/*.md`) must run a command the CLI has, with only options that command takes; a failure
names the file and the line.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from rlprobe_patch.cli import main

REPO = Path(__file__).resolve().parents[2]  # tests/cli/ -> the repository
README = REPO / "README.md"
# Every file whose `sh` blocks are checked: the README, CONTRIBUTING.md and the docs pages.
DOCUMENTED = [README, REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]
MARKERS = ("<!-- options -->", "<!-- /options -->")
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
# Every command takes these; the README says so once instead of on every line.
EVERYWHERE = {"--json", "--help"}


def commands(group: click.Group = main, prefix: str = "") -> Iterator[tuple[str, click.Command]]:
    """Every command the CLI runs, by its full name (`cluster apply`), through click's own
    extension points (`list_commands`, `get_command`), as `--help` lists them."""
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        full = f"{prefix} {name}".strip()
        if isinstance(command, click.Group):
            yield from commands(command, full)
        else:
            yield full, command


def options(command: click.Command) -> set[str]:
    return {o for p in command.params if isinstance(p, click.Option) for o in p.opts + p.secondary_opts}


def lines_of_sh_blocks(text: str) -> list[str]:
    """The lines of every `sh` block, with backslash continuations joined."""
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    return [line for block in blocks for line in block.replace("\\\n", " ").splitlines()]


def invoked(line: str, names: set[str]) -> list[str]:
    """The commands an example line runs: `rlprobe-patch cluster apply|verify ...` runs two."""
    words = line.split()
    if len(words) < 2 or words[0] != "rlprobe-patch":
        return []
    if words[1] in names:
        return [words[1]]
    if len(words) > 2:
        return [f"{words[1]} {sub}" for sub in words[2].split("|") if f"{words[1]} {sub}" in names]
    return []


def synopsis() -> dict[str, set[str]]:
    text = README.read_text(encoding="utf-8")
    assert text.count(MARKERS[0]) == 1 and text.count(MARKERS[1]) == 1
    section = text.split(MARKERS[0])[1].split(MARKERS[1])[0]
    names = dict(commands())
    entries: dict[str, set[str]] = {}
    for line in filter(str.strip, lines_of_sh_blocks(section)):
        (name,) = invoked(line, set(names)) or [line]  # a line that runs no known command fails here
        assert name not in entries, f"{name}: twice in the synopsis"
        entries[name] = set(OPTION.findall(line))
    return entries


def test_every_command_takes_json() -> None:
    assert [name for name, command in commands() if "--json" not in options(command)] == []


def test_the_synopsis_lists_every_command_once() -> None:
    assert sorted(synopsis()) == sorted(name for name, _ in commands())


def test_the_synopsis_lists_every_option_of_every_command() -> None:
    entries = synopsis()
    for name, command in commands():
        takes = {o for o in options(command) if o.startswith("--")} - EVERYWHERE
        assert entries.get(name, set()) == takes, f"rlprobe-patch {name}"


def test_the_documentation_is_there() -> None:
    """The pages this test reads exist (a moved docs/ folder would otherwise check nothing)."""
    assert (REPO / "docs" / "index.md").is_file() and len(DOCUMENTED) > 3
    assert all(path.is_file() for path in DOCUMENTED)


@pytest.mark.parametrize("path", DOCUMENTED, ids=[p.relative_to(REPO).as_posix() for p in DOCUMENTED])
def test_example_lines_use_only_options_the_command_takes(path: Path) -> None:
    names = dict(commands())
    where = path.relative_to(REPO).as_posix()
    wrong = []
    for line in lines_of_sh_blocks(path.read_text(encoding="utf-8")):
        words = line.split()
        runs = invoked(line, set(names))
        if words[:1] == ["rlprobe-patch"] and not runs and not (len(words) > 1 and words[1].startswith("-")):
            wrong.append(f"{where}: {line.strip()!r}: no such command")
        for name in runs:
            if unknown := sorted(set(OPTION.findall(line.split("#")[0])) - options(names[name])):
                wrong.append(f"{where}: {line.strip()!r}: rlprobe-patch {name} takes no {', '.join(unknown)}")
    assert wrong == []


def test_the_sites_first_path_is_the_readmes() -> None:
    """docs/index.md repeats the README's first path ("My `rollout_probs_diff_mean` is 0.02: what now?"); the copy
    is the one tests/runtime/test_first_path_runtime.py runs, block and placeholders alike (issue 42)."""
    heading = "## My `rollout_probs_diff_mean` is 0.02: what now?"

    def path(text: str) -> str:
        section = text.split(heading, 1)[1]
        start = section.index("```sh\n")
        return section[start : section.index("\n\n", section.index("\nWhere ", start) + 1)]

    assert path((REPO / "docs" / "index.md").read_text(encoding="utf-8")) == path(README.read_text(encoding="utf-8"))
