"""The engine's architecture (src/rlprobe_patch/): `[tool.importlinter]` in pyproject.toml is its contract, run
by CI's `lint-imports` and here: the layers (nothing imports upward; the packages on one line do not import each
other), the bottom package's and the CLI's own layers, no import circle between siblings at any depth
(`acyclic_siblings`), the toolkit's private modules behind its facade, and where click, Ray, LibCST, GitPython and
the heavy libraries may be imported. Each kind of contract is shown to fail on a planted import (so that none is a
contract nothing could break).
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

SRC = REPO / "src"
PACKAGE = SRC / "rlprobe_patch"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")  # import-linter: the test extra


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
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "COLUMNS": "250"}  # a contract's name on one line
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(root / "pyproject.toml"), "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )


def test_the_contracts_are_kept() -> None:
    run = lint_imports(REPO)
    assert run.returncode == 0, run.stdout + run.stderr
    contracts = len(re.findall(r"^\[\[tool\.importlinter\.contracts\]\]$", (REPO / "pyproject.toml").read_text(), re.M))
    assert contracts >= 10 and f"{contracts} kept, 0 broken" in run.stdout


def _planted(tmp_path: Path, module: str, line: str) -> subprocess.CompletedProcess[str]:
    """`lint-imports` on a copy of the package where `module` (a path under rlprobe_patch/) imports `line` inside a
    function (function-level imports count)."""
    shutil.copytree(PACKAGE, tmp_path / "src" / "rlprobe_patch", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / "src" / "rlprobe_patch" / module
    target.write_text(target.read_text() + f"\n\ndef _planted() -> None:\n    {line}  # noqa\n")
    return lint_imports(tmp_path)


@pytest.mark.parametrize(
    ("module", "line", "contract", "detail"),
    [
        # upward: the record layer reaching the CLI
        ("record/registry.py", "from rlprobe_patch.cli import main", "Layers:", "record.registry -> rlprobe_patch.cli"),
        # sideways between independent packages: the report reaching the workflow
        (
            "report/verdict.py",
            "from rlprobe_patch.workflow import derive",
            "Layers:",
            "report.verdict -> rlprobe_patch.workflow",
        ),
        # a circle inside one package, closed in a function
        (
            "record/folder.py",
            "from rlprobe_patch.record import transaction",
            "No import circle",
            "- .transaction -> .folder",
        ),
        # one command importing another
        ("cli/verify.py", "from rlprobe_patch.cli import apply", "The CLI:", "cli.verify -> rlprobe_patch.cli.apply"),
        # click below the CLI; LibCST in the launch reader; a toolkit module past the facade
        ("core/status.py", "import click", "Only the CLI speaks click", "core.status -> click"),
        ("launch/model.py", "import libcst", "The release data", "launch.model -> libcst"),
        (
            "core/sites.py",
            "from rlprobe_patch.codemod import _toolkit",
            "The codemod toolkit",
            "core.sites -> rlprobe_patch.codemod._toolkit",
        ),
        # the node's code, shipped by value, reaching the package
        (
            "cluster/node.py",
            "from rlprobe_patch.base import errors",
            "What runs on a cluster node",
            "cluster.node -> rlprobe_patch.base.errors",
        ),
    ],
)
def test_a_planted_import_breaks_its_contract(
    tmp_path: Path, module: str, line: str, contract: str, detail: str
) -> None:
    run = _planted(tmp_path, module, line)
    assert run.returncode != 0
    broken = [row for row in run.stdout.splitlines() if row.endswith(" BROKEN")]
    assert any(row.startswith(contract) for row in broken), run.stdout
    assert detail in run.stdout, run.stdout
    if contract == "No import circle":  # inside one package no layer is crossed: the circle contract alone sees it
        assert len(broken) == 1, run.stdout
