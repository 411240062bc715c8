"""Upgrades on the fixture trees (fast part of the suite; tests/real/test_upgrades.py runs them on real releases).

A patch's new revision (a catalogue copy named by `$RLPROBE_PATCH_CATALOGUE`) is reported as
`applied r1, current r2` and upgraded by apply in one record; a record whose package was
replaced by another release is superseded, not an edit.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES, changed_catalogue, cli, cli_json, snapshot

from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.catalogue.patches import get_patch, load_catalogue
from rlprobe_patch.catalogue.releases import CATALOGUE_ENV

PATCH = "verl.megatron-engine"
OLD = get_patch(PATCH).revision  # the catalogue's revision, then the test catalogue's
NEW = OLD + 1


@pytest.fixture
def catalogue_r2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Switch to a copy of the catalogue whose `verl.megatron-engine` payload changed (revision 2)."""
    dest = changed_catalogue(tmp_path / "catalogue-r2", PATCH, NEW)

    def switch() -> None:
        monkeypatch.setenv(CATALOGUE_ENV, str(dest))
        load_catalogue.cache_clear()

    yield switch
    monkeypatch.delenv(CATALOGUE_ENV, raising=False)
    load_catalogue.cache_clear()


def test_outdated_then_upgraded(fixture_tree, catalogue_r2) -> None:
    root = fixture_tree("0.9")
    pristine = snapshot(root)
    assert cli("apply", "--verl-root", root, "--backend", "megatron").exit_code == 0
    catalogue_r2()
    code, out = cli_json("status", "--verl-root", root)
    patch = {p["id"]: p for p in out["trees"][0]["patches"]}[PATCH]
    assert (patch["state"], patch["recorded_revision"], patch["revision"]) == ("outdated", OLD, NEW)
    assert f"applied r{OLD}, current r{NEW}" in cli("status", "--verl-root", root).stdout
    code, out = cli_json("verify", "--verl-root", root)
    assert code == ExitCode.OK
    assert any(f"applied r{OLD}, current r{NEW}" in c["detail"] for c in out["trees"][0]["checks"] if c["warning"])
    code, out = cli_json("apply", "--verl-root", root, "--backend", "megatron")
    assert code == ExitCode.OK, out
    assert out["upgraded"] == [{"id": PATCH, "from": OLD, "to": NEW}] and len(out["replaced"]) == 1
    ledger = json.loads((root / ".rlprobe-patch" / "ledger.json").read_text())
    assert [[(p["id"], p["revision"]) for p in r["patches"]] for r in ledger["records"]] == [[(PATCH, NEW)]]
    assert cli_json("verify", "--verl-root", root)[0] == ExitCode.OK
    assert cli_json("revert", "--verl-root", root)[0] == ExitCode.OK
    assert snapshot(root) == pristine


def test_upgrade_dry_run_and_edit(fixture_tree, catalogue_r2) -> None:
    root = fixture_tree("0.9")
    assert cli("apply", "--verl-root", root, "--backend", "megatron").exit_code == 0
    target = root / "verl/workers/engine/megatron/transformer_impl.py"
    target.write_bytes(target.read_bytes() + b"# mine\n")
    catalogue_r2()
    before = snapshot(root)
    result = cli("apply", "--verl-root", root, "--backend", "megatron", "--dry-run")
    assert result.exit_code == ExitCode.REVERT_BLOCKED and "# mine" in result.stderr
    code, out = cli_json("apply", "--verl-root", root, "--backend", "megatron", "--merge", "--dry-run")
    assert code == ExitCode.OK and "self._dump_steps = 0" in out["diff"]
    assert out["merged"] == [str(target.relative_to(root))]
    assert snapshot(root) == before  # a dry run writes nothing


def test_superseded_by_another_release(fixture_tree) -> None:
    root = fixture_tree("0.8")
    assert cli("apply", "--verl-root", root, "--backend", "fsdp").exit_code == 0
    shutil.rmtree(root / "verl")
    shutil.copytree(FIXTURES / "verl-0.9" / "verl", root / "verl")  # the package replaced by 0.9.1
    pristine = snapshot(root)
    code, out = cli_json("status", "--verl-root", root)
    assert out["trees"][0]["records"] == [] and out["trees"][0]["superseded"][0]["version"] == "0.8.0"
    code, out = cli_json("verify", "--verl-root", root)
    assert code == ExitCode.VERIFY_FAILED
    assert [c["check"] for c in out["trees"][0]["checks"] if not c["ok"]] == ["recorded"]
    code, out = cli_json("revert", "--verl-root", root)
    assert code == ExitCode.OK and out["trees"][0]["superseded"] and out["trees"][0]["files"] == []
    assert snapshot(root) == pristine
    assert json.loads((root / ".rlprobe-patch" / "ledger.json").read_text())["records"] == []


def test_an_edit_is_not_a_new_release(fixture_tree) -> None:
    """Same release, file changed: still an edit after apply (revert stops), never superseded."""
    root = fixture_tree("0.9")
    assert cli("apply", "--verl-root", root, "--backend", "fsdp").exit_code == 0
    target = root / "verl/workers/engine/fsdp/transformer_impl.py"
    target.write_bytes(target.read_bytes().replace(b"import ", b"import  ", 1))
    _, out = cli_json("status", "--verl-root", root)
    assert out["trees"][0]["superseded"] == [] and len(out["trees"][0]["records"]) == 1
    assert cli_json("revert", "--verl-root", root)[0] == ExitCode.REVERT_BLOCKED


def test_back_to_undoes_an_upgrade_exactly(fixture_tree, catalogue_r2) -> None:
    """`revert --back-to` (cluster apply's rollback of an upgrade) returns the tree to the older
    revision: the same files, the same record, the patch reported outdated again."""
    root = fixture_tree("0.9")
    assert cli("apply", "--verl-root", root, "--backend", "megatron").exit_code == 0
    assert not (root / ".rlprobe-patch" / "undo.json").exists()  # nothing to undo to but the original
    ledger_path = root / ".rlprobe-patch" / "ledger.json"
    older, older_ledger = snapshot(root), ledger_path.read_text()
    (old_id,) = [r["id"] for r in json.loads(older_ledger)["records"]]
    catalogue_r2()
    code, out = cli_json("apply", "--verl-root", root, "--backend", "megatron")
    assert code == ExitCode.OK and out["replaced"] == [old_id]
    new_id = out["record"]
    upgraded = snapshot(root)
    assert upgraded != older
    # Not the records before the newest apply: refused, nothing written.
    code, out = cli_json("revert", "--verl-root", root, "--back-to", "someone-else")
    assert code == ExitCode.REFUSED and "does not follow records someone-else" in out["message"]
    assert snapshot(root) == upgraded
    code, out = cli_json("revert", "--verl-root", root, "--back-to", old_id, "--dry-run")
    assert code == ExitCode.REFUSED and "no --dry-run" in out["message"] and snapshot(root) == upgraded
    # A file the upgrade wrote, edited since: stopped (exit 5), nothing written.
    target = root / "verl/workers/engine/megatron/transformer_impl.py"
    edited = target.read_bytes()
    target.write_bytes(edited + b"# mine\n")
    code, out = cli_json("revert", "--verl-root", root, "--back-to", old_id)
    assert code == ExitCode.REVERT_BLOCKED and "changed since" in out["message"]
    target.write_bytes(edited)
    code, out = cli_json("revert", "--verl-root", root, "--back-to", old_id)
    assert code == ExitCode.OK and out["trees"][0]["reverted"] == [new_id]
    assert snapshot(root) == older and ledger_path.read_text() == older_ledger
    assert not (root / ".rlprobe-patch" / "undo.json").exists()
    code, out = cli_json("status", "--verl-root", root)
    assert {p["id"]: p["state"] for p in out["trees"][0]["patches"]}[PATCH] == "outdated"
    assert cli_json("verify", "--verl-root", root)[0] == ExitCode.OK
    # Again: the ledger already holds exactly those records, so there is nothing to do.
    code, out = cli_json("revert", "--verl-root", root, "--back-to", old_id)
    assert code == ExitCode.OK and out["trees"][0]["reverted"] == [] and snapshot(root) == older
    assert cli_json("revert", "--verl-root", root)[0] == ExitCode.OK  # and revert still goes to the original


def test_kill_at_every_write_of_an_undo(fixture_tree, catalogue_r2, tmp_path: Path) -> None:
    """`revert --back-to` killed (SIGKILL) at each of its write checkpoints: the next command
    finishes or leaves the undo through the journal, and the tree is whole at r1 or r2; a second
    `--back-to` then lands at r1 exactly."""
    prepared = fixture_tree("0.9")
    assert cli("apply", "--verl-root", prepared, "--backend", "megatron").exit_code == 0
    older = snapshot(prepared)
    older_records = json.loads((prepared / ".rlprobe-patch" / "ledger.json").read_text())["records"]
    catalogue_r2()
    assert cli("apply", "--verl-root", prepared, "--backend", "megatron").exit_code == 0
    upgraded = snapshot(prepared)
    outcomes = []
    for k in range(1, 20):
        root = tmp_path / f"k{k}"
        shutil.copytree(prepared, root, symlinks=True)
        env = {**os.environ, "RLPROBE_PATCH_STATE_HOME": str(tmp_path / f"home-{k}")}
        undo = [sys.executable, "-m", "rlprobe_patch", "revert", "--verl-root", str(root), "--back-to"]
        undo.append(older_records[0]["id"])
        proc = subprocess.run(undo, env={**env, "RLPROBE_PATCH_FAULT": f"kill-at={k}"}, capture_output=True)
        if proc.returncode == 0:  # past the last checkpoint
            outcomes.append("finished")
            assert snapshot(root) == older
            break
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        status = subprocess.run([*undo[:3], "status", "--verl-root", str(root)], env=env, capture_output=True)
        assert status.returncode == ExitCode.OK, status.stderr
        records = json.loads((root / ".rlprobe-patch" / "ledger.json").read_text())["records"]
        assert (snapshot(root), len(records)) in ((older, 1), (upgraded, 1)), k
        outcomes.append("r1" if snapshot(root) == older else "r2")
        assert subprocess.run(undo, env=env, capture_output=True).returncode == 0
        assert snapshot(root) == older
        assert json.loads((root / ".rlprobe-patch" / "ledger.json").read_text())["records"] == older_records
    assert outcomes[-1] == "finished" and "r1" in outcomes and "r2" in outcomes, outcomes
