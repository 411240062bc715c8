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
