"""verify remembers which file contents it (or apply, in memory) found patched.

The key is the patch, the file, the patch's fingerprint (tool version, codemod toolkit, the
patch folder's files) and the sha256 of the file's bytes; a file whose key is known is not
parsed again. Anything else (an edit, another fingerprint, `--recheck`, a damaged cache) gets
the full syntax-tree check, and the answer is the same either way.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

from conftest import cli_json

from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.catalogue.patches import get_patch

FSDP = "verl/workers/engine/fsdp/transformer_impl.py"
HOOKS = "verl.fsdp-engine: hooks in place in " + FSDP
UNCHANGED = "file unchanged since its syntax-tree check"


def hooks_check(root: Path, *extra: str) -> dict:
    code, out = cli_json("verify", "--verl-root", root, *extra)
    checks = {c["check"]: c for c in out["trees"][0]["checks"]}
    compiles = checks[f"compiles: {FSDP}"]
    return {"code": code, **checks[HOOKS], "compiles": compiles["ok"], "compiles_detail": compiles["detail"]}


def checked(root: Path) -> list[str]:
    return json.loads((root / ".rlprobe-patch/checked.json").read_text())["applied"]


def test_apply_remembers_the_final_files_and_verify_uses_it(fixture_tree) -> None:
    root = fixture_tree("0.9")
    assert cli_json("apply", "--verl-root", root, "--backend", "fsdp")[0] == ExitCode.OK
    (key,) = checked(root)
    assert key.startswith(f"verl.fsdp-engine|{FSDP}|")
    first = hooks_check(root)
    assert first["code"] == ExitCode.OK and first["ok"] and first["detail"] == UNCHANGED and first["compiles"]
    assert first["compiles_detail"] == "file unchanged since it compiled"  # apply compiled what it wrote
    full = hooks_check(root, "--recheck")
    assert full["code"] == ExitCode.OK and full["ok"] and full["detail"] == "" and full["compiles"]
    assert full["compiles_detail"] == ""


def test_bytes_that_do_not_compile_are_never_remembered(fixture_tree) -> None:
    root = fixture_tree("0.9")
    assert cli_json("apply", "--verl-root", root, "--backend", "fsdp")[0] == ExitCode.OK
    path = root / FSDP
    path.write_text(path.read_text() + "\nreturn None\n")  # parses (LibCST, ast), but Python refuses to compile it
    for _ in range(2):
        check = hooks_check(root)
        assert check["ok"] and check["detail"] == ""  # the hooks are in place
        assert not check["compiles"] and "outside function" in check["compiles_detail"]
        assert len(checked(root)) == 1  # only apply's bytes: the edited ones are checked again each time


def test_an_edited_file_gets_the_full_check(fixture_tree) -> None:
    root = fixture_tree("0.9")
    assert cli_json("apply", "--verl-root", root, "--backend", "fsdp")[0] == ExitCode.OK
    path = root / FSDP
    path.write_text(path.read_text() + "\n# a comment: same syntax tree\n")
    check = hooks_check(root)
    assert check["ok"] and check["detail"] == ""  # parsed: still patched
    assert check["code"] == ExitCode.VERIFY_FAILED  # the edit itself is drift from the recorded post-image
    assert len(checked(root)) == 2  # and the new bytes are remembered
    assert hooks_check(root)["detail"] == UNCHANGED
    # A hook taken out by hand: parsed, found drifted, never remembered.
    text = path.read_text()
    path.write_text(text.replace("self._ensure_debugger()", "pass", 1))
    check = hooks_check(root)
    assert not check["ok"] and check["detail"].startswith("drifted:")
    assert len(checked(root)) == 2


def test_another_fingerprint_or_a_damaged_cache_means_a_full_check(fixture_tree) -> None:
    root = fixture_tree("0.9")
    assert cli_json("apply", "--verl-root", root, "--backend", "fsdp")[0] == ExitCode.OK
    (key,) = checked(root)
    patch_id, target, fingerprint, digest = key.split("|")
    memo = root / ".rlprobe-patch/checked.json"
    memo.write_text(json.dumps({"applied": [f"{patch_id}|{target}|{'0' * len(fingerprint)}|{digest}"]}))
    check = hooks_check(root)
    assert check["code"] == ExitCode.OK and check["ok"] and check["detail"] == ""
    assert key in checked(root)
    memo.write_text("{not json")
    check = hooks_check(root)
    assert check["code"] == ExitCode.OK and check["ok"] and check["detail"] == ""
    assert checked(root) == [key]


def test_the_fingerprint_follows_the_patch_folder(tmp_path: Path) -> None:
    patch = get_patch("verl.fsdp-engine")
    folder = tmp_path / patch.id
    shutil.copytree(patch.folder, folder)
    shutil.copytree(patch.folder.parent / "_shared", tmp_path / "_shared")
    copy = dataclasses.replace(patch, folder=folder)
    assert copy.fingerprint == patch.fingerprint
    (folder / "cases" / "new-case").mkdir()  # the before/after cases do not decide anything
    assert dataclasses.replace(patch, folder=folder).fingerprint == patch.fingerprint
    shared = tmp_path / "_shared" / "worker_hooks.py"  # the shared parts its payload takes decide too
    shared.write_text(shared.read_text() + "\n")
    assert dataclasses.replace(patch, folder=folder).fingerprint != patch.fingerprint
    shutil.copy(patch.folder.parent / "_shared" / "worker_hooks.py", shared)
    assert dataclasses.replace(patch, folder=folder).fingerprint == patch.fingerprint
    payload = folder / "payload.py"
    payload.write_text(payload.read_text() + "\n")
    assert dataclasses.replace(patch, folder=folder).fingerprint != patch.fingerprint
