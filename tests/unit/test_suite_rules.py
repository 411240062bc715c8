"""Rules of the test suite itself: its fast part never downloads, and every marker is declared."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import REPO, package_wheel, verl_wheel


def test_unmarked_test_cannot_fetch_a_wheel() -> None:
    with pytest.raises(pytest.fail.Exception, match="belongs in tests/real/"):
        verl_wheel("0.9.1")
    with pytest.raises(pytest.fail.Exception, match="belongs in tests/real/"):
        package_wheel("sglang", "0.5.11")


def test_undeclared_marker_is_an_error(tmp_path: Path) -> None:
    """--strict-markers: a misspelt `real` would otherwise silently put a slow test in the fast part."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    (tmp_path / "tests" / "test_x.py").write_text(
        textwrap.dedent(
            """
            import pytest

            @pytest.mark.reel
            def test_x():
                pass
            """
        )
    )
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "tests"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert run.returncode != 0
    assert "'reel' not found in `markers` configuration option" in run.stdout


def collected(*args: str) -> set[str]:
    """The test ids pytest selects from the whole suite with `args` (pyproject's addopts included). Collecting runs
    no assert: `--assert=plain` spares rewriting every test module's asserts (two thirds of a collection's time)."""
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-n", "0", "--assert=plain"]
        + list(args),
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return {line for line in run.stdout.splitlines() if "::" in line}


def test_the_readme_command_runs_a_representative_slice_and_the_exhaustive_leg_the_rest() -> None:
    """Issue 35, item 10: the README's test command (`pytest -n auto`, pyproject's `-m 'not exhaustive'`)
    holds every folder and, of each release cell, the oldest and newest release; `-m exhaustive` holds the
    corpus sweeps and the releases between; together they are the whole suite."""
    from packaging.version import Version

    from rlprobe_patch.catalogue.releases import releases

    default, exhaustive = collected(), collected("-m", "exhaustive")
    everything = collected("-m", "exhaustive or not exhaustive")
    assert default and exhaustive and not default & exhaustive and default | exhaustive == everything
    folders = {test.split("/")[1] for test in default}
    assert folders >= {"unit", "cli", "real", "runtime", "cluster"}, folders
    assert not {t for t in default if t.startswith("tests/real/test_script_corpus")}
    tested = sorted(releases("verl").tested, key=Version)
    cell = "tests/real/test_hydra_config_real.py::test_catalogue_defaults_match_hydra[{}]"
    assert {cell.format(tested[0]), cell.format(tested[-1])} <= default
    assert {cell.format(r) for r in tested[1:-1]} <= exhaustive
    # this one runs 0.7.1, 0.8.0, 0.9.1: verl's newest stays (0.9.1 is also a vLLM release between vLLM's ends)
    cell = "tests/runtime/test_runtime_consistency.py::test_consistency_set_runs_in_real_verl[{}]"
    assert cell.format("0.9.1") in default and {cell.format("0.7.1"), cell.format("0.8.0")} <= exhaustive
    # a test of no package's oldest or newest release keeps its own newest
    cell = "tests/real/test_real_releases.py::test_legacy_worker_notice[{}]"
    assert cell.format("0.7.1") in default and cell.format("0.6.1") in exhaustive
    # every patch (group) of the patched-bytes cells keeps a cell in the slice
    groups = {
        (t.split("[")[1].split(" ")[0], *t.split("[")[1].rstrip("]").split(" ")[2:])
        for t in everything
        if "test_bytes_of_every_real_cell" in t
    }
    kept = {
        (t.split("[")[1].split(" ")[0], *t.split("[")[1].rstrip("]").split(" ")[2:])
        for t in default
        if "test_bytes_of_every_real_cell" in t
    }
    assert groups == kept
