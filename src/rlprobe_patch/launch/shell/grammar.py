"""bash's grammar (tree-sitter-bash): a script's bytes checked and parsed, and what the evaluator asks of its nodes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from rlprobe_patch.base.errors import RefusedError
from rlprobe_patch.launch.shell.fields import MAX_BYTES

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


def without_comments(tree: Any, data: bytes) -> str:
    text = bytearray(data)
    stack = [tree.root_node]
    while stack:
        node = stack.pop()
        if node.type == "comment":
            text[node.start_byte : node.end_byte] = b" " * (node.end_byte - node.start_byte)
        else:
            stack.extend(node.children)
    return text.decode("utf-8", "replace")


def bash_verdict(path: Path) -> str | None:
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


def glued(children: Any) -> list[list[Any]]:
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


def opaque(text: str) -> str:
    """Text kept as written for what was not evaluated: one word (no-break spaces), as its value would be."""
    return re.sub(r"\s+", "\u00a0", text)


def is_at(node: Any) -> bool:
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


def first_line(node: Any) -> str:
    return str(node.text.decode("utf-8", "replace").splitlines()[0][:60] if node.text else node.type)


def command_name(node: Any) -> str:
    name = node.child_by_field_name("name")
    return name.text.decode() if name is not None else ""
