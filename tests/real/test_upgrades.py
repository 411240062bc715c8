"""Upgrades of patched trees, on real verl releases.

- Ours: a tree patched by revision 1 of a patch, then a catalogue whose payload changed
  (revision 2; a copy of `patches/` named by `$RLPROBE_PATCH_CATALOGUE`): status and verify say
  `applied r1, current r2`; apply upgrades in one transaction (one record), stops on edits
  made after apply and keeps them with `--merge`; kill -9 at each write of the upgrade.
- Upstream's: verl 0.8.0 patched in a site-packages folder, then replaced by 0.9.1 as
  `pip install -U verl` does: the record is superseded (reported, dropped, files untouched),
  not an edit; verify, apply and revert act on the live record only.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import VLLM_ASCEND_MEMBERS, changed_catalogue, package_wheel, snapshot, unpack, verl_wheel

from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.base.fsio import sha256
from rlprobe_patch.catalogue.patches import get_patch, patches_dir

ENGINE = "verl/workers/engine/fsdp/transformer_impl.py"
PATCH = "verl.fsdp-engine"
OLD = get_patch(PATCH).revision  # the catalogue's revision, then the test catalogue's
NEW = OLD + 1
UPGRADE = f"applied r{OLD}, current r{NEW}"


def run(*args: object, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rlprobe_patch", *map(str, args)], env=env, capture_output=True, text=True
    )


def run_json(*args: object, env: dict[str, str]) -> tuple[int, dict]:
    proc = run(*args, "--json", env=env)
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


@pytest.fixture
def catalogue_r2(tmp_path: Path) -> Path:
    """A copy of the catalogue with `verl.fsdp-engine`'s payload changed and its revision bumped."""
    return changed_catalogue(tmp_path / "catalogue-r2", PATCH, NEW)


@pytest.fixture
def envs(tmp_path: Path, catalogue_r2: Path, state_home: Path) -> tuple[dict[str, str], dict[str, str]]:
    """(environment of the current catalogue, environment of the r2 catalogue), one registry."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("RLPROBE_PATCH_")}
    base["RLPROBE_PATCH_STATE_HOME"] = str(state_home)
    return base, {**base, "RLPROBE_PATCH_CATALOGUE": str(catalogue_r2)}


def install(site: Path, version: str) -> None:
    """verl `version` into `site` as pip lays it out (package and dist-info), replacing any other release."""
    for old in [site / "verl", *site.glob("verl-*.dist-info")]:
        if old.exists():
            shutil.rmtree(old)
    with zipfile.ZipFile(verl_wheel(version)) as zf:
        zf.extractall(site)


def reference(tmp_path: Path, version: str, env: dict[str, str], *args: str) -> dict[str, tuple[str, int]]:
    """What a fresh apply with `env`'s catalogue makes of a pristine tree."""
    root = tmp_path / f"reference-{len(list(tmp_path.iterdir()))}"
    root.mkdir()
    install(root, version)
    ref_env = {**env, "RLPROBE_PATCH_STATE_HOME": str(root / ".state-home")}
    assert run("apply", "--verl-root", root, *args, env=ref_env).returncode == 0
    shutil.rmtree(root / ".state-home")
    return snapshot(root)


def states(out: dict) -> dict[str, dict]:
    return {p["id"]: p for t in out["trees"] for p in t["patches"]}


# -- upstream's upgrade (pip install -U verl) ------------------------------------------------------
def test_pip_upgrade_supersedes_the_record(tmp_path: Path, envs) -> None:
    env, _ = envs
    site = tmp_path / "site-packages"
    site.mkdir()
    install(site, "0.8.0")
    assert run("apply", "--verl-root", site, "--backend", "fsdp", env=env).returncode == 0
    install(site, "0.9.1")  # what `pip install -U verl` does: files replaced, version changed
    pristine = snapshot(site)

    code, out = run_json("status", "--verl-root", site, env=env)
    assert code == ExitCode.OK
    (tree,) = out["trees"]
    assert tree["tree"]["version"] == "0.9.1"
    assert tree["records"] == [] and [s["version"] for s in tree["superseded"]] == ["0.8.0"], tree
    assert states(out)[PATCH]["state"] == "applicable"

    # verify: nothing is applied any more (the hooks went with 0.8.0); no check of the stale diff
    code, out = run_json("verify", "--verl-root", site, env=env)
    assert code == ExitCode.VERIFY_FAILED
    checks = out["trees"][0]["checks"]
    failed = [c for c in checks if not c["ok"]]
    assert [c["check"] for c in failed] == ["recorded"] and "superseded" in failed[0]["detail"], failed
    assert any(c["warning"] and "superseded" in c["detail"] for c in checks)
    assert snapshot(site) == pristine

    # apply: patches 0.9.1 and leaves one record (the superseded one dropped, no file of it touched)
    proc = run("apply", "--verl-root", site, "--backend", "fsdp", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "superseded" in proc.stdout
    ledger = json.loads((site / ".rlprobe-patch" / "ledger.json").read_text())
    assert [r["version"] for r in ledger["records"]] == ["0.9.1"]
    code, out = run_json("verify", "--verl-root", site, env=env)
    assert code == ExitCode.OK, [c for t in out["trees"] for c in t["checks"] if not c["ok"]]

    # revert: the live record only, byte for byte
    code, out = run_json("revert", "--verl-root", site, env=env)
    assert code == ExitCode.OK, out
    assert snapshot(site) == pristine


def test_revert_after_pip_upgrade_drops_the_record(tmp_path: Path, envs) -> None:
    env, _ = envs
    site = tmp_path / "site-packages"
    site.mkdir()
    install(site, "0.8.0")
    assert run("apply", "--verl-root", site, "--backend", "fsdp", "--mode", "consistency", env=env).returncode == 0
    install(site, "0.9.1")
    pristine = snapshot(site)
    code, out = run_json("revert", "--verl-root", site, env=env)
    assert code == ExitCode.OK, out
    (tree,) = out["trees"]
    assert tree["reverted"] == [] and tree["files"] == [] and len(tree["superseded"]) == 1
    assert snapshot(site) == pristine
    ledger = json.loads((site / ".rlprobe-patch" / "ledger.json").read_text())
    assert ledger["records"] == []
    code, out = run_json("status", "--verl-root", site, env=env)
    assert out["trees"][0]["superseded"] == []


def pip_upgrade(site: Path, dist: str, version: str, prefixes: tuple[str, ...]) -> None:
    """What `pip install -U` does: remove the files the installed release's RECORD lists (and only
    those), then unpack the new release."""
    (info,) = site.glob(f"{dist.replace('-', '_')}-*.dist-info")
    for row in (info / "RECORD").read_text().splitlines():
        path = site / row.split(",")[0]
        if path.is_file():
            path.unlink()
    shutil.rmtree(info, ignore_errors=True)
    unpack(package_wheel(dist, version), site, prefixes)


def test_pip_upgrade_leaves_no_file_a_patch_added(tmp_path: Path, envs) -> None:
    """vllm-ascend.dispatch-logger adds dispatch_logger.py; `pip install -U vllm-ascend` leaves it
    (it is in no RECORD). The next apply records it as added again, so revert removes it: the tree
    ends as the new release alone. Before the fix the new record left it out and revert kept it."""
    env, _ = envs
    site = unpack(package_wheel("vllm-ascend", "0.13.0"), tmp_path / "site-packages", VLLM_ASCEND_MEMBERS)
    added = "vllm_ascend/worker/dispatch_logger.py"
    args = ("--vllm-ascend-root", site, "--mode", "consistency")
    assert run("apply", *args, env=env).returncode == 0
    pip_upgrade(site, "vllm-ascend", "0.18.0", VLLM_ASCEND_MEMBERS)
    assert (site / added).is_file()  # left behind by the upgrade
    pristine = {k: v for k, v in snapshot(site).items() if k != added}

    code, out = run_json("apply", *args, env=env)
    assert code == ExitCode.OK, out
    ledger = json.loads((site / ".rlprobe-patch" / "ledger.json").read_text())
    (record,) = ledger["records"]
    assert record["version"] == "0.18.0" and added in [f["path"] for f in record["files"]]
    code, out = run_json("verify", *args, env=env)
    assert code == ExitCode.OK, out
    code, out = run_json("revert", "--vllm-ascend-root", site, env=env)
    assert code == ExitCode.OK, out
    assert snapshot(site) == pristine


def test_a_changed_file_left_by_an_upgrade_is_kept(tmp_path: Path, envs) -> None:
    """The same, but someone edited the left-behind file: it is not ours any more, so apply
    neither records nor removes it."""
    env, _ = envs
    site = unpack(package_wheel("vllm-ascend", "0.13.0"), tmp_path / "site-packages", VLLM_ASCEND_MEMBERS)
    added = site / "vllm_ascend/worker/dispatch_logger.py"
    args = ("--vllm-ascend-root", site, "--mode", "consistency")
    assert run("apply", *args, env=env).returncode == 0
    pip_upgrade(site, "vllm-ascend", "0.18.0", VLLM_ASCEND_MEMBERS)
    edited = added.read_bytes() + b"# mine\n"
    added.write_bytes(edited)
    code, out = run_json("apply", *args, env=env)
    # The edit is a comment: the file still has the syntax tree the patch adds (applied), but it
    # is not recorded as ours, so neither apply nor revert writes it.
    assert code == ExitCode.OK and out["files"] == ["vllm_ascend/worker/model_runner_v1.py"], out
    code, out = run_json("revert", "--vllm-ascend-root", site, env=env)
    assert code == ExitCode.OK, out
    assert added.read_bytes() == edited


# -- our upgrade (a new revision of a patch) -------------------------------------------------------
@pytest.mark.parametrize(("version", "args"), [("0.9.1", ("--mode", "consistency")), ("0.8.0", ())])
def test_upgrade_to_a_new_revision(tmp_path: Path, envs, version: str, args: tuple[str, ...]) -> None:
    env, env_r2 = envs
    apply_args = ("--backend", "fsdp", *args)
    want = reference(tmp_path, version, env_r2, *apply_args)
    root = tmp_path / "tree"
    root.mkdir()
    install(root, version)
    pristine = snapshot(root)
    assert run("apply", "--verl-root", root, *apply_args, env=env).returncode == 0
    r1 = snapshot(root)

    code, out = run_json("status", "--verl-root", root, env=env_r2)
    assert code == ExitCode.OK
    fsdp = states(out)[PATCH]
    assert (fsdp["state"], fsdp["recorded_revision"], fsdp["revision"]) == ("outdated", OLD, NEW)
    text = run("status", "--verl-root", root, env=env_r2).stdout
    assert UPGRADE in text, text
    code, out = run_json("verify", "--verl-root", root, env=env_r2)
    assert code == ExitCode.OK, [c for c in out["trees"][0]["checks"] if not c["ok"]]
    assert any(UPGRADE in c["detail"] for c in out["trees"][0]["checks"] if c["warning"])

    proc = run("apply", "--verl-root", root, *apply_args, env=env_r2)
    assert proc.returncode == 0, proc.stderr
    assert f"upgraded r{OLD} -> r{NEW}" in proc.stdout, proc.stdout
    assert snapshot(root) == want  # exactly what r2 makes of the pristine tree
    ledger = json.loads((root / ".rlprobe-patch" / "ledger.json").read_text())
    (record,) = ledger["records"]
    assert {p["id"]: p["revision"] for p in record["patches"]}[PATCH] == NEW
    diff = (root / ".rlprobe-patch" / record["diff"]).read_text()
    assert f"{PATCH} r{NEW}" in diff and "# Replaces:" in diff

    code, out = run_json("verify", "--verl-root", root, env=env_r2)
    assert code == ExitCode.OK, [c for c in out["trees"][0]["checks"] if not c["ok"]]
    assert not any(f"current r{NEW}" in c["detail"] for c in out["trees"][0]["checks"])
    again = run("apply", "--verl-root", root, *apply_args, env=env_r2)
    assert again.returncode == 0 and "already applied" in again.stdout
    assert run("revert", "--verl-root", root, env=env_r2).returncode == 0
    assert snapshot(root) == pristine
    assert r1 != want


def test_upgrade_stops_on_an_edit_and_merges_it(tmp_path: Path, envs) -> None:
    env, env_r2 = envs
    root = tmp_path / "tree"
    root.mkdir()
    install(root, "0.9.1")
    pristine = snapshot(root)
    assert run("apply", "--verl-root", root, "--backend", "fsdp", env=env).returncode == 0
    engine = root / ENGINE
    edited = engine.read_bytes() + b"\n# my own note, kept across upgrades\n"
    engine.write_bytes(edited)

    proc = run("apply", "--verl-root", root, "--backend", "fsdp", env=env_r2)
    assert proc.returncode == ExitCode.REVERT_BLOCKED, proc.stderr
    assert "my own note" in proc.stderr and "--merge" in proc.stderr
    assert engine.read_bytes() == edited  # nothing written

    proc = run("apply", "--verl-root", root, "--backend", "fsdp", "--merge", env=env_r2)
    assert proc.returncode == 0, proc.stderr
    assert "kept your edits" in proc.stdout
    text = engine.read_text()
    assert "my own note" in text and "self._dump_steps = 0" in text
    code, out = run_json("verify", "--verl-root", root, env=env_r2)
    assert code == ExitCode.OK, [c for c in out["trees"][0]["checks"] if not c["ok"]]
    # The record's original is the merged one: revert keeps the note and removes the patch.
    assert run("revert", "--verl-root", root, env=env_r2).returncode == 0
    with zipfile.ZipFile(verl_wheel("0.9.1")) as zf:
        assert engine.read_bytes() == zf.read(ENGINE) + b"\n# my own note, kept across upgrades\n"
    assert {k: v for k, v in snapshot(root).items() if k != ENGINE} == {
        k: v for k, v in pristine.items() if k != ENGINE
    }


# -- verl.logprob-capture revision 2 -> 3 (issue 41): a real tree patched by the revision before -----
CAPTURE = "verl.logprob-capture"
CAPTURE_R2 = Path(__file__).resolve().parents[1] / "data" / "logprob-capture-r2"
V1_TRAINER = "verl/trainer/ppo/v1/trainer_base.py"


@pytest.fixture
def catalogue_capture_r2(tmp_path: Path) -> Path:
    """The catalogue with `verl.logprob-capture` as revision 2 was (its payload and patch.toml, kept in
    tests/data/logprob-capture-r2/): what trees patched before revision 3 hold."""
    dest = tmp_path / "catalogue-capture-r2"
    shutil.copytree(patches_dir(), dest, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copyfile(CAPTURE_R2 / "payload.py.txt", dest / CAPTURE / "payload.py")
    shutil.copyfile(CAPTURE_R2 / "patch.toml", dest / CAPTURE / "patch.toml")
    return dest


def test_logprob_capture_r2_tree_upgrades_to_r3_keeping_an_edit(tmp_path: Path, envs, catalogue_capture_r2) -> None:
    env, _ = envs
    env_r2 = {**env, "RLPROBE_PATCH_CATALOGUE": str(catalogue_capture_r2)}
    args = ("--backend", "fsdp", "--mode", "consistency", "--worker-impl", "engine")
    want = reference(tmp_path, "0.9.1", env, *args)
    root = tmp_path / "tree"
    root.mkdir()
    install(root, "0.9.1")
    pristine = snapshot(root)
    assert run("apply", "--verl-root", root, *args, env=env_r2).returncode == 0
    # exactly what revision 2 wrote (its pinned hashes, kept beside its payload)
    pinned = json.loads((CAPTURE_R2 / "patched-bytes.json").read_text())["verl 0.9.1 consistency"]
    assert {rel: h for rel, (h, _) in snapshot(root).items() if pristine.get(rel, (None,))[0] != h} == pinned

    code, out = run_json("status", "--verl-root", root, env=env)
    assert code == ExitCode.OK
    found = states(out)
    assert (found[CAPTURE]["state"], found[CAPTURE]["recorded_revision"], found[CAPTURE]["revision"]) == (
        "outdated",
        2,
        3,
    )
    (record,) = json.loads((root / ".rlprobe-patch" / "ledger.json").read_text())["records"]
    others = [p["id"] for p in record["patches"] if p["id"] != CAPTURE]
    assert others and {found[i]["state"] for i in others} == {"applied"}  # the rest of the set is unchanged
    code, out = run_json("verify", "--verl-root", root, env=env)
    assert code == ExitCode.OK, [c for c in out["trees"][0]["checks"] if not c["ok"]]
    assert any("applied r2, current r3" in c["detail"] for c in out["trees"][0]["checks"] if c["warning"])

    trainer = root / V1_TRAINER
    note = b"# my own note, kept across upgrades\n"  # at the top: the capture's class ends the file
    trainer.write_bytes(note + trainer.read_bytes())
    proc = run("apply", "--verl-root", root, *args, env=env)
    assert proc.returncode == ExitCode.REVERT_BLOCKED and "--merge" in proc.stderr, proc.stderr
    proc = run("apply", "--verl-root", root, *args, "--merge", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "upgraded r2 -> r3" in proc.stdout and "kept your edits" in proc.stdout, proc.stdout
    upgraded = snapshot(root)
    assert {k: v for k, v in upgraded.items() if k != V1_TRAINER} == {k: v for k, v in want.items() if k != V1_TRAINER}
    # the edit kept on revision 3's bytes
    assert trainer.read_bytes().startswith(note) and sha256(trainer.read_bytes()[len(note) :]) == want[V1_TRAINER][0]
    assert "_rlprobe_kv_prompt_ids" in trainer.read_text()
    code, out = run_json("verify", "--verl-root", root, env=env)
    assert code == ExitCode.OK, [c for c in out["trees"][0]["checks"] if not c["ok"]]
    assert not any("current r3" in c["detail"] for c in out["trees"][0]["checks"])

    assert run("revert", "--verl-root", root, env=env).returncode == 0
    with zipfile.ZipFile(verl_wheel("0.9.1")) as zf:
        assert trainer.read_bytes() == note + zf.read(V1_TRAINER)
    assert {k: v for k, v in snapshot(root).items() if k != V1_TRAINER} == {
        k: v for k, v in pristine.items() if k != V1_TRAINER
    }


# the exhaustive leg's (issue 35): a sweep, too long for the README's test command
@pytest.mark.exhaustive
def test_kill_at_every_write_of_an_upgrade(tmp_path: Path, envs) -> None:
    env, env_r2 = envs
    r2 = reference(tmp_path, "0.9.1", env_r2, "--backend", "fsdp")
    prepared = tmp_path / "prepared"
    prepared.mkdir()
    install(prepared, "0.9.1")
    pristine = snapshot(prepared)
    assert run("apply", "--verl-root", prepared, "--backend", "fsdp", env=env).returncode == 0
    r1 = snapshot(prepared)
    outcomes = []
    for k in range(1, 30):
        root = tmp_path / f"k{k}"
        shutil.copytree(prepared, root)
        kenv = {**env_r2, "RLPROBE_PATCH_STATE_HOME": str(tmp_path / f"home-{k}")}
        proc = run(
            "apply", "--verl-root", root, "--backend", "fsdp", env={**kenv, "RLPROBE_PATCH_FAULT": f"kill-at={k}"}
        )
        if proc.returncode == 0:  # past the last checkpoint
            outcomes.append("finished")
            assert snapshot(root) == r2
            break
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        # Before the next command: the file whole (a temp file beside it is removed by that command).
        assert sha256((root / ENGINE).read_bytes()) in (r1[ENGINE][0], r2[ENGINE][0]), "a file half written"
        # The next command finishes (or leaves) the write; the tree is r1 (recorded) or r2 (recorded).
        code, out = run_json("status", "--verl-root", root, env=kenv)
        assert code == ExitCode.OK, out
        assert not (root / ".rlprobe-patch" / "journal.json").exists()
        fsdp = states(out)[PATCH]
        ledger = json.loads((root / ".rlprobe-patch" / "ledger.json").read_text())
        assert len(ledger["records"]) == 1
        assert snapshot(root) in (r1, r2)
        if snapshot(root) == r1:
            assert fsdp["state"] == "outdated", fsdp
            outcomes.append("r1")
            assert run("apply", "--verl-root", root, "--backend", "fsdp", env=kenv).returncode == 0
        else:
            assert fsdp["state"] == "applied", fsdp
            outcomes.append("r2")
        assert snapshot(root) == r2
        code, out = run_json("verify", "--verl-root", root, env=kenv)
        assert code == ExitCode.OK, [c for c in out["trees"][0]["checks"] if not c["ok"]]
        assert run("revert", "--verl-root", root, env=kenv).returncode == 0
        assert snapshot(root) == pristine
    assert outcomes[-1] == "finished" and "r1" in outcomes and "r2" in outcomes, outcomes
