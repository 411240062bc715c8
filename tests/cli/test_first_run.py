"""A new user's first run (issue 35, item 1): what the README's `pip install .` gives must be enough.

`pip install . && rlprobe-patch demo --consistency` ran ten minutes, then stopped with
`ModuleNotFoundError: numpy` reported as an internal error. Two checks: every third-party module
the engine imports (outside the optional `cluster` commands, whose Ray is the `ray` extra) comes
with a base dependency of pyproject.toml, so the README's install has it; and where numpy is
missing all the same (an install with `--no-deps`), the commands that need it refuse at their
start, naming the install line, before any venv is built.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src" / "rlprobe_patch"
# Imported only by commands whose extra the README names beside them (`cluster`: the `ray` extra).
OPTIONAL = {"ray": "ray"}


def third_party_imports() -> dict[str, set[str]]:
    """Top-level module -> the engine files importing it (the drivers run in the demo's venvs, the probes in the
    training interpreter: skipped)."""
    # tomllib: the standard library's from 3.11; on 3.10 the `sys.version_info` gate imports tomli instead
    local = set(sys.stdlib_module_names) | {"rlprobe_patch", "__future__", "tomllib"}
    found: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        if {"drivers", "probes"} & set(path.relative_to(SRC).parts):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in local:
                    found.setdefault(top, set()).add(str(path.relative_to(REPO)))
    return found


def applies(requirement: Requirement) -> bool:
    """Whether pip installs `requirement` here (its marker true, no extra asked for)."""
    return requirement.marker is None or requirement.marker.evaluate({"extra": ""})


def test_the_readme_install_brings_every_module_the_engine_imports() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {r.name.lower() for r in map(Requirement, project["dependencies"])}  # tomli: on 3.10 only
    base = {r.name.lower() for r in map(Requirement, project["dependencies"]) if applies(r)}
    # and what those bring (omegaconf with hydra-core), as installed here
    base |= {r.name.lower() for d in list(base) for r in map(Requirement, metadata.requires(d) or []) if applies(r)}
    distributions = metadata.packages_distributions()
    missing = []
    for module, files in sorted(third_party_imports().items()):
        if module in OPTIONAL:
            assert OPTIONAL[module] in project["optional-dependencies"], module
            continue
        provided = {d.lower() for d in distributions.get(module, [module])}
        if not provided & (base | declared):
            missing.append(f"{module} ({', '.join(sorted(provided))}), imported by {', '.join(sorted(files))}")
    assert "numpy" in third_party_imports()  # the report's and the demo's capture: the case of issue 35
    assert not missing, "not a base dependency in pyproject.toml:\n" + "\n".join(missing)


# Runs the command with numpy unimportable, as after `pip install --no-deps .` beside no numpy.
WITHOUT_NUMPY = "import sys; sys.modules['numpy'] = None; from rlprobe_patch.cli import main; main()"


@pytest.mark.parametrize(
    "args",
    [
        ["demo", "--consistency"],
        ["report", "{tmp}"],
    ],
    ids=["demo-vllm", "report"],
)
def test_without_numpy_the_command_refuses_at_its_start(tmp_path: Path, args: list[str]) -> None:
    home = tmp_path / "home"
    home.mkdir()
    workdir = tmp_path / "work"
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if argv[0] == "demo":
        argv += ["--workdir", str(workdir)]
    env = {**os.environ, "HOME": str(home), "RLPROBE_TEST_CACHE": str(tmp_path / "cache"), "PIP_NO_INDEX": "1"}
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_NUMPY, *argv], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 3, done.stderr
    assert "needs numpy" in done.stderr and "-m pip install 'numpy>=" in done.stderr, done.stderr
    assert "internal error" not in done.stderr
    assert sys.executable in done.stderr  # which Python to install it into
    # Refused before any work: no scratch folder, no venv built, nothing cached.
    assert not workdir.exists()
    assert not any(home.iterdir()) and not (tmp_path / "cache").exists()
