"""slime (issue 18): tree discovery, versions and the cells of its patches on the real releases.

slime is not on the package index: its releases are `git archive` tarballs in
`../shared/upstream/slime/`, unpacked here into a temporary folder as the source checkout users
install with `pip install -e .` (the package and the setup.py that holds the version).
Each release: apply, verify, py_compile, a second apply that writes nothing, and a revert that
leaves every file byte-identical; anchors moved on the real file are refused with the reason.
"""

from __future__ import annotations

import os
import py_compile
import sys
from pathlib import Path

import pytest
from conftest import SLIME_MODEL, cli, cli_json, snapshot
from script_oracle import SHARED

from rlprobe_patch import matrix
from rlprobe_patch.base.errors import ExitCode, NotATreeError
from rlprobe_patch.catalogue import wheels
from rlprobe_patch.catalogue.releases import releases
from rlprobe_patch.catalogue.trees import find_tree

pytestmark = pytest.mark.skipif(
    not (SHARED / "upstream" / "slime").is_dir(), reason="../shared/upstream/slime is not beside the repository"
)

SLIME = releases("slime")


@pytest.fixture
def slime_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RLPROBE_UPSTREAM", str(SHARED / "upstream"))

    def make(version: str) -> Path:
        return wheels.unpack_release(wheels.fetch_release("slime", version), tmp_path / f"slime-{version}", "slime")

    return make


def interpreter_importing(root: Path, where: Path) -> Path:
    """A real interpreter that imports slime from the checkout `root`, as `pip install -e .` does."""
    python = where / "bin" / "python"
    python.parent.mkdir(parents=True, exist_ok=True)
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{root}" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    return python


@pytest.mark.parametrize("version", SLIME.tested)
def test_version_from_setup_py_and_through_python(slime_tree, tmp_path: Path, version: str) -> None:
    root = slime_tree(version)
    tree = find_tree("slime", root)
    says = SLIME.reported(version)  # v0.2.4's setup.py still says 0.2.3
    assert (str(tree.version), tree.version_source) == (says, "setup.py")
    assert find_tree("slime", root / "slime").root == root  # the package folder works too
    python = interpreter_importing(root, tmp_path / "env")
    found = find_tree("slime", None, str(python))
    assert (found.root, str(found.version)) == (root, says)


def test_version_from_dist_info_and_not_pypi_slime(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    (site / "slime" / "backends").mkdir(parents=True)
    (site / "slime" / "__init__.py").write_text("")
    (site / "slime-0.3.1.dist-info").mkdir()
    (site / "slime-0.3.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: slime\nVersion: 0.3.1\n")
    tree = find_tree("slime", site)
    assert (str(tree.version), tree.version_source) == ("0.3.1", "dist-info")
    other = tmp_path / "other"
    (other / "slime").mkdir(parents=True)
    (other / "slime" / "__init__.py").write_text("")
    with pytest.raises(NotATreeError, match="not THUDM's slime"):
        find_tree("slime", other)


def test_setup_py_is_read_never_run(slime_tree, tmp_path: Path) -> None:
    root = slime_tree("0.3.1")
    marker = tmp_path / "ran"
    setup = root / "setup.py"
    setup.write_text(f"open({str(marker)!r}, 'w')\n" + setup.read_text())
    assert str(find_tree("slime", root).version) == "0.3.1"
    assert not marker.exists()


@pytest.mark.parametrize("version", SLIME.tested)
def test_megatron_actor_cell(slime_tree, version: str) -> None:
    root = slime_tree(version)
    original = snapshot(root)
    code, out = cli_json("apply", "--slime-root", root)
    assert code == ExitCode.OK, out
    assert out["status"] == "applied" and out["files"] == [SLIME_MODEL]
    assert [p["id"] for p in out["patches"]] == ["slime.megatron-actor"]
    assert out["tree"]["version"] == SLIME.reported(version) and out["tree"]["version_source"] == "setup.py"
    assert out["patches"][0]["tested_release"]
    py_compile.compile(str(root / SLIME_MODEL), doraise=True, cfile=str(root.parent / "c.pyc"))
    text = (root / SLIME_MODEL).read_text()
    assert text.count("_rlprobe_slime_dump.start_micro_batch(model, data_iterator)") == 2
    assert "torch.cuda" not in text.split("class _RlprobeSlimeDump")[1]  # device-agnostic
    code, verified = cli_json("verify", "--slime-root", root)
    assert code == ExitCode.OK, [c for t in verified["trees"] for c in t["checks"] if not c["ok"]]
    patched = snapshot(root)
    code, again = cli_json("apply", "--slime-root", root)
    assert code == ExitCode.OK and again["status"] == "already applied"
    assert snapshot(root) == patched
    status = cli("status", "--slime-root", root).stdout
    assert f"slime {SLIME.reported(version)}" in status and "slime.megatron-actor" in status
    assert cli_json("revert", "--slime-root", root)[0] == ExitCode.OK
    assert snapshot(root) == original


ROLLOUT = "slime/rollout/sglang_rollout.py"


@pytest.mark.parametrize("version", SLIME.tested)
def test_request_id_cell_and_consistency_set(slime_tree, version: str) -> None:
    root = slime_tree(version)
    original = snapshot(root)
    code, out = cli_json("apply", "--slime-root", root, "--only", "slime.request-id")
    assert code == ExitCode.OK, out
    assert out["files"] == [ROLLOUT]
    py_compile.compile(str(root / ROLLOUT), doraise=True, cfile=str(root.parent / "c.pyc"))
    assert 'payload["rid"] = f"slime-{sample.index}"' in (root / ROLLOUT).read_text()
    code, out = cli_json("apply", "--slime-root", root, "--mode", "consistency")
    assert code == ExitCode.OK, out
    assert out["files"] == [SLIME_MODEL]  # the request id was in place: only the actor hook is new
    assert {p["id"]: p["state"] for p in out["patches"]} == {
        "slime.megatron-actor": "applicable",
        "slime.request-id": "applied",
    }
    code, verified = cli_json("verify", "--slime-root", root)
    assert code == ExitCode.OK, [c for t in verified["trees"] for c in t["checks"] if not c["ok"]]
    assert cli_json("revert", "--slime-root", root)[0] == ExitCode.OK
    assert snapshot(root) == original


MOVED = {
    "get_batch": (
        "        batch = get_batch(",
        "        batch = next_batch(",
        "train_one_step.<locals>.forward_step: expected `batch = get_batch(...)` in the body of `forward_step`",
    ),
    "forward_backward_func": (
        "    losses_reduced = forward_backward_func(",
        "    losses_reduced = run_schedule(",
        "train_one_step: expected `losses_reduced = forward_backward_func(...)` in the function body",
    ),
    "mpu": (
        "from megatron.core import mpu\n",
        "from megatron.core import parallel_state\n",
        "expected the names `os`, `torch`, `mpu`, `logger` defined at module level; found no `mpu`",
    ),
}


@pytest.mark.parametrize("version", [SLIME.tested[0], SLIME.tested[-1]])
@pytest.mark.parametrize("moved", sorted(MOVED))
def test_moved_anchor_is_refused_with_the_reason(slime_tree, version: str, moved: str) -> None:
    root = slime_tree(version)
    old, new, reason = MOVED[moved]
    text = (root / SLIME_MODEL).read_text()
    where = text.index("def train_one_step") if moved == "get_batch" else 0
    (root / SLIME_MODEL).write_text(text[:where] + text[where:].replace(old, new, 1))
    original = snapshot(root)
    result = cli("apply", "--slime-root", root)
    assert result.exit_code == ExitCode.REFUSED, result.output
    assert reason in " ".join(result.stderr.split()), result.stderr
    assert SLIME_MODEL in result.stderr
    assert snapshot(root) == original and not (root / ".rlprobe-patch").exists()


def test_matrix_runs_slime_from_its_archives(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLPROBE_UPSTREAM", str(SHARED / "upstream"))
    cells = matrix.run_matrix(("slime.megatron-actor", "slime.request-id"), ("0.3.1",))
    assert [(c.patch, c.outcome) for c in cells] == [
        ("slime.megatron-actor", "applied"),
        ("slime.request-id", "applied"),
    ], cells


def test_python_without_verl_patches_slime(slime_tree, tmp_path: Path) -> None:
    root = slime_tree("0.3.1")
    python = interpreter_importing(root, tmp_path / "env")
    env = {**os.environ}
    code, out = cli_json("apply", "--python", python, "--dry-run")
    assert code == ExitCode.OK, out
    assert [t["tree"]["package"] for t in out["trees"]] == ["slime"]
    assert out["files"] == [SLIME_MODEL] and os.environ == env
