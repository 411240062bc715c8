"""`$(...)` and `$((...))`: the few command substitutions whose output is known without running anything (`pwd`,
`cd`, `dirname`, `basename`, `realpath`, `echo`, an import probe answered by the training interpreter) and integer
arithmetic."""

from __future__ import annotations

import ast
import operator
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlprobe_patch.base.interpreter import finds
from rlprobe_patch.launch.shell.fields import Seg
from rlprobe_patch.launch.shell.grammar import opaque
from rlprobe_patch.launch.shell.state import Evaluation

PROBE_VIA = "import probe answered by"


class Substitutions(Evaluation):
    """Command substitutions and arithmetic."""

    def substitution(self, node: Any) -> Seg:
        """`$(...)`: the few forms whose output is known without running anything."""
        text = node.text.decode()
        body = [c for c in node.children if c.is_named]
        saved = self.cwd  # $( ) runs in a subshell
        try:
            out, _ = self.captured(body[0]) if len(body) == 1 else (None, None)
        finally:
            self.cwd = saved
        if out is None:
            return Seg(opaque(text), unresolved=(f"{self.here(node)}: `{text[:60]}` not evaluated",))
        via = (f"{PROBE_VIA} {self.python}",) if "import " in text else ()
        return Seg(out.rstrip("\n"), via=via)

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
        probe = import_probe(name, args, self.python)
        if probe is not None:
            return "", probe
        return None, None

    def arithmetic(self, node: Any) -> Seg:
        text = node.text.decode()
        expression = text[3:-2]

        def value_of(m: re.Match[str]) -> str:
            var = self.lookup(m.group(1) or m.group(2))
            return var.text if var is not None and var.text.strip() else "0"

        substituted = re.sub(r"\$\{?(\w+)\}?|\b([A-Za-z_]\w*)\b", value_of, expression)
        result = arith(substituted)
        if result is None:
            return Seg(opaque(text), unresolved=(f"{self.here(node)}: `{text}` not evaluated",))
        return Seg(str(result))


def import_probe(name: str, args: list[str], python: str) -> bool | None:
    """`python3 -c 'import torch_npu'`: whether `python` finds the module (found, not imported)."""
    if not re.search(r"(^|/)python[\d.]*$", name) or len(args) != 2 or args[0] != "-c":
        return None
    m = re.fullmatch(r"\s*import\s+([A-Za-z_][\w.]*)\s*;?\s*", args[1])
    if not m:
        return None
    return finds(python, m.group(1).split(".")[0])


ARITH_OPS: dict[type, Callable[..., int]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def arith(expression: str) -> int | None:
    """Integer arithmetic as bash does it (`/` truncates), nothing else."""
    try:
        tree = ast.parse(expression.replace("/", "//").strip() or "0", mode="eval")
    except SyntaxError:
        return None

    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in ARITH_OPS:
            return ARITH_OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in ARITH_OPS:
            return ARITH_OPS[type(node.op)](walk(node.operand))
        raise ValueError(node)

    try:
        return walk(tree.body)
    except (ValueError, ZeroDivisionError):
        return None
