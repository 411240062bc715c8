"""`rlprobe-patch matrix` on a small subset of cells (the full matrix is the other real-release tests).

One cell of each outcome: applied (verl 0.8.0 Megatron engine, SGLang 0.5.8), refused by
design (verl 0.4.1), native (SGLang 0.5.11), and a cell made to disagree with the catalogue
(failing, exit 4). The README table is written between its markers only.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import cli, cli_json

from rlprobe_patch import matrix
from rlprobe_patch.base.errors import ExitCode

SUBSET = ("--patch", "verl.megatron-engine", "--patch", "sglang.model-runner")
RELEASES = ("--release", "0.4.1", "--release", "0.8.0", "--release", "0.5.8", "--release", "0.5.11")


def test_matrix_subset_table(tmp_path: Path, state_home: Path) -> None:
    page = tmp_path / "compatibility.md"
    page.write_text("# title\n\n| hand | table |\n\n<!-- matrix -->\nold\n<!-- /matrix -->\n\ntail\n")
    code, out = cli_json("matrix", *SUBSET, *RELEASES, "--write-docs", "--page", page)
    assert code == ExitCode.OK, out
    cells = {(c["patch"], c["release"]): c["outcome"] for c in out["cells"]}
    assert cells == {
        ("verl.megatron-engine", "0.4.1"): "refused-by-design",
        ("verl.megatron-engine", "0.8.0"): "applied",
        ("sglang.model-runner", "0.5.8"): "applied",
        ("sglang.model-runner", "0.5.11"): "native",
    }
    table = out["table"]
    assert "| verl | `verl.megatron-engine` |" in table
    assert "| 0.8.0 | applied |" in table and "| 0.4.1 | refused-by-design |" in table
    assert "| 0.5.11 | native |" in table
    text = page.read_text()
    assert text == f"# title\n\n| hand | table |\n\n<!-- matrix -->\n{table}<!-- /matrix -->\n\ntail\n"
    assert not (state_home / "registry.json").exists()  # scratch trees stay out of the user's registry


def test_matrix_cell_disagreeing_with_catalogue_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(matrix, "expected", lambda patch, release: matrix.APPLIED)
    code, out = cli_json("matrix", "--patch", "sglang.model-runner", "--release", "0.5.11")
    assert code == ExitCode.VERIFY_FAILED
    (cell,) = out["cells"]
    assert cell["outcome"] == "failing" and cell["detail"].startswith("expected applied, got native")
    assert "- failing: sglang.model-runner on sglang 0.5.11: expected applied" in out["table"]


def test_matrix_refuses_page_without_markers(tmp_path: Path) -> None:
    """The old option names (`--write-readme`, `--readme`) still work: the same refusal."""
    readme = tmp_path / "README.md"
    readme.write_text("no markers\n")
    result = cli(
        "matrix", "--patch", "sglang.model-runner", "--release", "0.5.11", "--write-readme", "--readme", readme
    )
    assert result.exit_code == ExitCode.REFUSED
    assert "needs exactly one <!-- matrix --> ... <!-- /matrix --> pair" in result.stderr
    assert readme.read_text() == "no markers\n"


def test_every_claimed_release_is_a_cell() -> None:
    """No `tested` release of the catalogue is left out of the matrix."""
    for patch in matrix.load_catalogue():
        assert set(patch.tested) <= set(matrix.releases_of(patch.package)), patch.id
