"""Bad input the record or the tree can hold: each gives its message and exit code, and writes nothing.

A record edited by hand (a diff or a ledger naming `../` or an absolute path, invalid JSON,
hashes changed), a tree moved after apply, a tree patched by hand from the skill's
instructions, and `revert` with nothing to revert. (Not a tree, unsupported release, syntax
error, non-UTF-8, symlinked package, read-only tree: tests/cli/test_cli.py.)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import cli, cli_json, snapshot

from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.base.fsio import sha256

FSDP = "verl/workers/engine/fsdp/transformer_impl.py"


def everything(root: Path) -> dict[str, str]:
    """Every file, our state folder included (the lock file holds the last holder's pid: left out)."""
    return {p.relative_to(root).as_posix(): sha256(p.read_bytes()) for p in root.rglob("*") if p.is_file()} | {
        ".rlprobe-patch/lock": ""
    }


@pytest.fixture
def applied(fixture_tree) -> tuple[Path, dict, dict]:
    """A 0.9 fixture tree with the FSDP hook applied: (root, original snapshot, its ledger)."""
    root = fixture_tree("0.9")
    original = snapshot(root)
    assert cli_json("apply", "--verl-root", root, "--backend", "fsdp")[0] == ExitCode.OK
    return root, original, json.loads((root / ".rlprobe-patch/ledger.json").read_text())


def write_ledger(root: Path, ledger: dict) -> None:
    (root / ".rlprobe-patch/ledger.json").write_text(json.dumps(ledger))


@pytest.mark.parametrize("bad", ["../verl/workers/engine/fsdp/transformer_impl.py", "/etc/hosts"])
def test_recorded_diff_naming_a_path_outside_the_tree(applied, bad: str) -> None:
    root, _, ledger = applied
    diff = root / ".rlprobe-patch" / ledger["records"][0]["diff"]
    diff.write_text(diff.read_text().replace(f"a/{FSDP}", f"a/{bad}").replace(f"b/{FSDP}", f"b/{bad}"))
    before = everything(root)
    code, out = cli_json("verify", "--verl-root", root)
    assert code == ExitCode.VERIFY_FAILED
    failed = {c["check"].split(":")[0]: c["detail"] for c in out["trees"][0]["checks"] if not c["ok"]}
    assert "the recorded diff names a path outside its tree" in failed["recorded diff reverse-applies"]
    code, out = cli_json("revert", "--verl-root", root)
    assert code == ExitCode.REFUSED
    assert out["message"].endswith("does not match its history; nothing was written")
    assert "the recorded diff names a path outside its tree" in out["details"][0]
    assert everything(root) == before


@pytest.mark.parametrize("bad", ["../outside.py", "/tmp/outside.py"])
def test_ledger_naming_a_path_outside_the_tree(applied, tmp_path: Path, bad: str) -> None:
    root, _, ledger = applied
    outside = tmp_path / "outside.py"
    outside.write_bytes((root / FSDP).read_bytes())  # would match the recorded hash: must still not be touched
    ledger["records"][0]["files"][0]["path"] = bad if bad.startswith("..") else str(outside)
    write_ledger(root, ledger)
    before = everything(root)
    for command in ("verify", "revert", "status"):
        code, out = cli_json(command, "--verl-root", root)
        assert code == ExitCode.REFUSED, (command, out)
        assert "ledger.json names a path outside its tree" in out["message"]
        assert "edited by hand or damaged" in out["hint"]
    assert everything(root) == before and outside.read_bytes() == (root / FSDP).read_bytes()


def test_ledger_that_is_not_json(applied) -> None:
    root, _, _ = applied
    (root / ".rlprobe-patch/ledger.json").write_text('{"root": oops')
    before = everything(root)
    for command in ("verify", "revert", "status"):
        code, out = cli_json(command, "--verl-root", root)
        assert code == ExitCode.REFUSED, (command, out)
        assert "ledger.json is unreadable" in out["message"] and "edited by hand" in out["hint"]
    result = cli("revert", "--verl-root", root)
    assert result.exit_code == ExitCode.REFUSED and "error: " in result.stderr and "Traceback" not in result.stderr
    assert everything(root) == before


@pytest.mark.parametrize(
    ("where", "value"),
    [
        (("files", "mode"), "420"),  # a mode as text: chmod would fail halfway (issue 44)
        (("files", "path"), ["verl", "x.py"]),  # not a path
        (("files", "before_blob"), None),
        (("patches", "revision"), "one"),
        (("files", "planted"), "by hand"),  # a key rlprobe-patch does not write
    ],
)
def test_ledger_with_a_field_of_another_type_is_refused(applied, where: tuple[str, str], value: object) -> None:
    """The ledger comes from a tree others can write: each field is checked against its type (and no unknown key
    is taken) before anything is read or written; refused (exit 3) as unreadable, never an internal error."""
    root, _, ledger = applied
    entry = ledger["records"][0][where[0]][0]
    entry[where[1]] = value
    write_ledger(root, ledger)
    before = everything(root)
    for command in ("verify", "revert", "status"):
        code, out = cli_json(command, "--verl-root", root)
        assert code == ExitCode.REFUSED, (command, out)
        assert "ledger.json is unreadable" in out["message"] and "edited by hand" in out["hint"]
        assert where[1] in out["message"]  # the field named
    assert everything(root) == before


@pytest.mark.parametrize("field", ["after", "before", "after_blob"])
def test_ledger_with_hashes_changed_by_hand(applied, field: str) -> None:
    root, _, ledger = applied
    ledger["records"][0]["files"][0][field] = "0" * 64 if field != "after_blob" else "0" * 40
    write_ledger(root, ledger)
    before = everything(root)
    code, out = cli_json("verify", "--verl-root", root)
    assert code == ExitCode.VERIFY_FAILED
    failed = [c for c in out["trees"][0]["checks"] if not c["ok"]]
    assert any(c["check"].startswith("ledger matches history.git") for c in failed), failed
    code, out = cli_json("revert", "--verl-root", root)
    assert code == ExitCode.REFUSED and "does not match its history" in out["message"]
    side = "before" if field == "before" else "after"
    assert out["details"] == [f"{FSDP}: the {side} hash in ledger.json does not match history.git"]
    assert everything(root) == before


def test_tree_moved_after_apply(applied, tmp_path: Path) -> None:
    root, original, _ = applied
    moved = tmp_path / "moved"
    shutil.move(root, moved)
    code, out = cli_json("verify")  # the registry names the old place
    assert code == ExitCode.REFUSED
    assert f"every registered tree is gone: --verl-root {root}: no such directory" == out["message"]
    assert "moved or was deleted" in out["hint"] and "rlprobe-patch forget PATH" in out["hint"]
    code, out = cli_json("verify", "--verl-root", moved)
    assert code == ExitCode.OK
    (note,) = [c for c in out["trees"][0]["checks"] if c["check"] == "recorded root"]
    assert note["warning"] and f"the record names {root}, the tree is now at {moved}" in note["detail"]
    text = cli("revert", "--verl-root", moved, "--dry-run").stdout
    assert f"notice: the record names {root}; the tree moved here after apply" in text
    code, out = cli_json("revert", "--verl-root", moved)
    assert code == ExitCode.OK and out["trees"][0]["moved_from"] == str(root)
    assert snapshot(moved) == original


HAND_METHODS = """    def _ensure_debugger(self):
        if getattr(self, "_debugger", None) is None and os.environ.get("DUMP_ON") == "1":
            from msprobe.pytorch import PrecisionDebugger

            self._debugger = PrecisionDebugger(config_path="/home/config_actor.json")

    def _log_update_actor_step(self, micro_batch):
        with open("update_actor_log.jsonl", "a") as fp:
            fp.write("{}\\n")

"""


def hand_patch(path: Path) -> None:
    """The FSDP engine patched by hand, roughly as the skill's markdown describes, differently from ours."""
    text = path.read_text()
    loop = '            with ctx, sync_ctx, torch.profiler.record_function(f"micro_batch{micro_batch_idx}"):\n'
    after = "            output_lst.append(meta_info)\n"
    guard = '            if getattr(self, "_debugger", None) is not None:\n'
    assert loop in text and after in text
    text = text.replace("    def forward_backward_batch(", HAND_METHODS + "    def forward_backward_batch(", 1)
    text = text.replace(loop, guard + "                self._debugger.start()\n" + loop, 1)
    stop = "                self._debugger.stop()\n                self._log_update_actor_step(micro_batch)\n"
    text = text.replace(after, guard + stop + after, 1)
    path.write_text("import os\n" + text)


def test_tree_patched_by_hand_from_the_skill_docs(fixture_tree) -> None:
    root = fixture_tree("0.9")
    hand_patch(root / FSDP)
    # The skill's marker check cannot tell a hand patch from ours: it passes.
    assert cli("check-engine-patch", "--verl-root", root, "--backend", "fsdp").exit_code == 0
    before = snapshot(root)
    code, out = cli_json("status", "--verl-root", root, "--backend", "fsdp")
    (fsdp,) = [p for p in out["trees"][0]["patches"] if p["id"] == "verl.fsdp-engine"]
    assert fsdp["state"] == "drifted"
    assert "added by hand (e.g. from the skill's instructions); not patching twice" in fsdp["reasons"][0]
    code, out = cli_json("apply", "--verl-root", root, "--backend", "fsdp")
    assert code == ExitCode.REFUSED and out["message"].endswith("nothing was written")
    assert any("added by hand" in d for d in out["details"])
    assert snapshot(root) == before and not (root / ".rlprobe-patch").exists()
    assert (root / FSDP).read_text().count("def _ensure_debugger") == 1  # never patched twice
    code, out = cli_json("verify", "--verl-root", root, "--backend", "fsdp")
    assert code == ExitCode.VERIFY_FAILED  # our syntax-tree check tells them apart


def test_revert_with_nothing_to_revert(applied) -> None:
    root, original, _ = applied
    assert cli_json("revert", "--verl-root", root)[0] == ExitCode.OK
    reverted = everything(root)
    code, out = cli_json("revert", "--verl-root", root)  # the record exists, with no patch left in it
    assert code == ExitCode.OK and out["trees"][0]["reverted"] == [] and out["trees"][0]["files"] == []
    assert "nothing applied: nothing to revert" in cli("revert", "--verl-root", root).stdout
    assert everything(root) == reverted and snapshot(root) == original


def test_damaged_ledger_on_an_applied_tree_is_refused_by_apply(applied) -> None:
    """Apply reads the record before answering, also when the tree needs nothing ("already applied")."""
    root, _, _ = applied
    (root / ".rlprobe-patch/ledger.json").write_text('{"root": oops')
    before = everything(root)
    for dry in ((), ("--dry-run",)):
        code, out = cli_json("apply", "--verl-root", root, "--backend", "fsdp", *dry)
        assert code == ExitCode.REFUSED, out
        assert "ledger.json is unreadable" in out["message"] and "edited by hand" in out["hint"]
    assert everything(root) == before


@pytest.mark.parametrize("bad", ["../outside.py", "/tmp/outside.py", None])
def test_journal_naming_a_path_outside_the_tree_or_damaged(applied, tmp_path: Path, bad: str | None) -> None:
    """A pending journal is carried out by the next command: one that names a path outside the
    tree (or cannot be read) is refused by every command, and nothing is written anywhere."""
    root, _, ledger = applied
    outside = tmp_path / "outside.py"
    outside.write_text("# not ours\n")
    journal = root / ".rlprobe-patch/journal.json"
    if bad is None:
        journal.write_text('{"op": "apply", "files": [')
    else:
        target = bad if bad.startswith("..") else str(outside)
        record = ledger["records"][0]["files"][0]
        journal.write_text(
            json.dumps(
                {
                    "op": "apply",
                    "record": "x",
                    "package": "verl",
                    "files": [
                        {"path": target, "mode": 0o644, "from": "", "to": record["after"], "blob": record["after_blob"]}
                    ],
                    "ledger": ledger,
                    "branches": {},
                }
            )
        )
    before = everything(root)
    for args in (("status",), ("verify",), ("revert",), ("apply", "--backend", "megatron")):
        code, out = cli_json(*args, "--verl-root", root)
        assert code == ExitCode.REFUSED, (args, out)
        expected = "journal.json is unreadable" if bad is None else "journal.json names a path outside its tree"
        assert expected in out["message"], (args, out)
    assert everything(root) == before and outside.read_text() == "# not ours\n"
    assert not (tmp_path / "outside.py.rlprobe-tmp").exists()
