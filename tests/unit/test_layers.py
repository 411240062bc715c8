"""The engine's layers (src/rlprobe_patch/): no import circle, nothing imports upward.

`[tool.importlinter]` in pyproject.toml is the layers contract; CI runs `lint-imports` on it.
Here the contract is run too, and shown to fail on a planted upward import (so that it is not a
contract nothing could break), and the imports are walked independently of import-linter:
module-level and function-level imports alike, none may close a circle.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from conftest import REPO

SRC = REPO / "src"
PACKAGE = SRC / "rlprobe_patch"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")  # import-linter: the test extra


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> Iterator[tuple[str, int, bool]]:
    """(name, line, at function level) of every import of ours in `path`: `import M` names M,
    `from M import x` names M.x (`known` takes it back to M when x is not a module)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    inside = {id(n) for f in functions for n in ast.walk(f) if n is not f}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"{node.module}.{a.name}" for a in node.names]
        else:
            assert not isinstance(node, ast.ImportFrom), f"{path}:{node.lineno}: a relative import"
            continue
        for name in names:
            if name == "rlprobe_patch" or name.startswith("rlprobe_patch."):
                yield name, node.lineno, id(node) in inside


def known(name: str, modules: set[str]) -> str:
    """The module of ours an import names (a name imported from a module is that module)."""
    while name not in modules and "." in name:
        name = name.rpartition(".")[0]
    return name


def graph() -> dict[str, set[str]]:
    sources = {module_name(p): p for p in PACKAGE.rglob("*.py") if "drivers" not in p.parts}
    modules = set(sources)
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in sources.items():
        for name, _, _ in imported(path):
            target = known(name, modules)
            if target != module:
                edges[module].add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_at_module_or_function_level() -> None:
    edges = graph()
    assert len(edges) > 60 and any(edges.values())  # the walk saw the engine
    assert cycles(edges) == []


def test_the_walk_finds_a_circle_closed_inside_a_function() -> None:
    edges = graph()
    edges["rlprobe_patch.record.folder"].add("rlprobe_patch.core.plan")  # as `def f(): from ..core.plan import x`
    assert any("rlprobe_patch.record.folder" in c and "rlprobe_patch.core.plan" in c for c in cycles(edges))


def test_no_function_level_import_in_core_or_record() -> None:
    """The write path imports what it needs at the top; only an optional dependency may wait, on a
    line that says so (`# optional: ...`)."""
    late = []
    for layer in ("core", "record"):
        for path in sorted((PACKAGE / layer).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            lines = text.splitlines()
            tree = ast.parse(text)
            for function in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]:
                late += [
                    f"{path.relative_to(SRC)}:{node.lineno}"
                    for node in ast.walk(function)
                    if isinstance(node, ast.Import | ast.ImportFrom) and "# optional" not in lines[node.lineno - 1]
                ]
    assert late == []


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` on the package under `root/src`, with `root/pyproject.toml`'s contract."""
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(root / "pyproject.toml"), "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )


def test_the_layers_contract_is_kept() -> None:
    run = lint_imports(REPO)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 kept, 0 broken" in run.stdout


def test_the_layers_contract_fails_on_an_upward_import(tmp_path: Path) -> None:
    """A planted upward import (the record layer reaching the CLI, inside a function) breaks it."""
    shutil.copytree(PACKAGE, tmp_path / "src" / "rlprobe_patch", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / "src" / "rlprobe_patch" / "record" / "registry.py"
    target.write_text(
        target.read_text() + "\n\ndef _planted() -> None:\n    from rlprobe_patch.cli import main  # noqa\n"
    )
    run = lint_imports(tmp_path)
    assert run.returncode != 0
    assert "BROKEN" in run.stdout and "rlprobe_patch.record.registry -> rlprobe_patch.cli" in run.stdout
