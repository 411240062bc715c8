"""Commands, exit codes and refusals on our fixture trees (fast; no download)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import FIXTURES, TESTS, cli, cli_json, snapshot

from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.base.fsio import locked

FSDP = "verl/workers/engine/fsdp/transformer_impl.py"
MEGATRON = "verl/workers/engine/megatron/transformer_impl.py"


@pytest.mark.parametrize("family", ["0.6", "0.8", "0.9"])
@pytest.mark.parametrize("backend", ["fsdp", "megatron"])
def test_apply_verify_revert_on_fixtures(fixture_tree, family: str, backend: str) -> None:
    root = fixture_tree(family)
    original = snapshot(root)
    code, out = cli_json("apply", "--verl-root", root, "--backend", backend, "--worker-impl", "engine")
    assert code == ExitCode.OK and out["status"] == "applied"
    code, out = cli_json("verify")
    assert code == ExitCode.OK, out
    code, out = cli_json("revert")
    assert code == ExitCode.OK
    assert snapshot(root) == original


def test_package_folder_itself_is_accepted(fixture_tree) -> None:
    root = fixture_tree("0.9")
    code, out = cli_json("apply", "--verl-root", root / "verl", "--backend", "fsdp2", "--dry-run")
    assert code == ExitCode.OK and out["tree"]["root"] == str(root)


def test_dry_run_prints_diff_and_writes_nothing(fixture_tree) -> None:
    root = fixture_tree("0.8")
    original = snapshot(root)
    result = cli("apply", "--verl-root", root, "--backend", "megatron", "--dry-run")
    assert result.exit_code == ExitCode.OK
    assert f"+++ b/{MEGATRON}" in result.stdout
    assert "+        if self._dump_should_record:  # rlprobe-patch" in result.stdout
    assert snapshot(root) == original and not (root / ".rlprobe-patch").exists()


def test_second_apply_says_already_applied(fixture_tree) -> None:
    root = fixture_tree("0.9")
    cli_json("apply", "--verl-root", root, "--backend", "fsdp")
    ledger = (root / ".rlprobe-patch" / "ledger.json").read_bytes()
    result = cli("apply", "--verl-root", root, "--backend", "fsdp")
    assert result.exit_code == ExitCode.OK
    assert "already applied: nothing written" in result.stdout
    assert (root / ".rlprobe-patch" / "ledger.json").read_bytes() == ledger


def test_status_states(fixture_tree) -> None:
    root = fixture_tree("0.9")
    cli_json("apply", "--verl-root", root, "--backend", "megatron")
    code, out = cli_json("status", "--verl-root", root)
    assert code == ExitCode.OK
    states = {p["id"]: p["state"] for p in out["trees"][0]["patches"]}
    assert states["verl.fsdp-engine"] == "applicable" and states["verl.megatron-engine"] == "applied"
    # The fixture holds the engines only: the trainer-side patches have no file to go to.
    assert states["verl.prompts-only"] == "drifted"
    assert out["trees"][0]["tree"]["version"] == "0.9.1"


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda tmp: tmp / "nowhere", "no such directory"),
        (lambda tmp: (tmp / "file.txt").write_text("x") and tmp / "file.txt", "is a file"),
        (lambda tmp: (tmp / "empty").mkdir() or tmp / "empty", "not a verl tree"),
    ],
)
def test_not_a_tree(tmp_path: Path, make, expected: str) -> None:
    code, out = cli_json("apply", "--verl-root", make(tmp_path), "--backend", "fsdp")
    assert code == ExitCode.REFUSED
    assert expected in out["message"]


def test_unsupported_release_refused_then_forced(fixture_tree) -> None:
    root = fixture_tree("0.9")
    (root / "verl/version/version").write_text("0.5.0\n")
    original = snapshot(root)
    code, out = cli_json("apply", "--verl-root", root, "--backend", "fsdp", "--worker-impl", "engine")
    assert code == ExitCode.REFUSED
    assert "unsupported release: verl 0.5.0 has no FSDP engine" in out["details"][0]
    assert snapshot(root) == original
    # The anchors are there (the tree really has the 0.9 layout): --force relaxes the range.
    code, out = cli_json("apply", "--verl-root", root, "--backend", "fsdp", "--worker-impl", "engine", "--force")
    assert code == ExitCode.OK
    assert any("--force" in n for p in out["patches"] for n in p["notices"])


def test_dev_tree_applies_with_untested_notice(fixture_tree) -> None:
    root = fixture_tree("0.9")
    (root / "verl/version/version").write_text("0.10.0.dev\n")
    code, out = cli_json("apply", "--verl-root", root, "--backend", "fsdp")
    assert code == ExitCode.OK
    assert out["tree"]["version"] == "0.10.0.dev0"
    assert any("not a tested release" in n for p in out["patches"] for n in p["notices"])


def test_missing_anchor_is_refused_with_scope(fixture_tree) -> None:
    root = fixture_tree("0.9")
    target = root / FSDP
    target.write_text(
        target.read_text().replace(
            "for micro_batch_idx, micro_batch in enumerate(micro_batches):",
            "for micro_batch_idx, micro_batch in enumerate(batches):",
        )
    )
    original = snapshot(root)
    code, out = cli_json("apply", "--verl-root", root, "--backend", "fsdp")
    assert code == ExitCode.REFUSED
    detail = " ".join(out["details"])
    assert "FSDPEngine.forward_backward_batch" in detail and "micro_batches" in detail and "found none" in detail
    assert snapshot(root) == original


def test_syntax_error_and_non_utf8_refused(fixture_tree) -> None:
    root = fixture_tree("0.9")
    (root / FSDP).write_text((root / FSDP).read_text() + "\ndef broken(:\n")
    code, out = cli_json("apply", "--verl-root", root, "--backend", "fsdp")
    assert code == ExitCode.REFUSED and "syntax error" in " ".join(out["details"])
    (root / MEGATRON).write_bytes((root / MEGATRON).read_bytes() + b"\n# caf\xe9\n")
    code, out = cli_json("apply", "--verl-root", root, "--backend", "megatron")
    assert code == ExitCode.REFUSED and "not UTF-8" in " ".join(out["details"])


def test_verify_fails_after_hand_edit(fixture_tree) -> None:
    root = fixture_tree("0.8")
    cli_json("apply", "--verl-root", root, "--backend", "fsdp")
    target = root / FSDP
    target.write_text(
        target.read_text().replace("                self._finish_dump_step(micro_batch)\n", "                pass\n")
    )
    code, out = cli_json("verify", "--verl-root", root)
    assert code == ExitCode.VERIFY_FAILED
    failed = {c["check"]: c["detail"] for c in out["trees"][0]["checks"] if not c["ok"]}
    assert f"unchanged since apply: {FSDP}" in failed
    assert "drifted" in failed[f"verl.fsdp-engine: hooks in place in {FSDP}"]


def test_revert_keeps_or_shows_later_edits(fixture_tree) -> None:
    root = fixture_tree("0.9")
    original = snapshot(root)
    cli_json("apply", "--verl-root", root, "--backend", "fsdp")
    target = root / FSDP
    edited = target.read_text().replace("        output_lst = []\n", "        output_lst = []  # my edit\n")
    target.write_text(edited)
    result = cli("revert", "--verl-root", root)
    assert result.exit_code == ExitCode.REVERT_BLOCKED
    assert "+        output_lst = []  # my edit" in result.stderr  # the edit is shown
    assert target.read_text() == edited  # nothing written
    code, out = cli_json("revert", "--verl-root", root, "--merge")
    assert code == ExitCode.OK and out["trees"][0]["merged"] == [FSDP]
    expected = (FIXTURES / "verl-0.9" / FSDP).read_text().replace("output_lst = []\n", "output_lst = []  # my edit\n")
    assert target.read_text() == expected
    assert {k: v for k, v in snapshot(root).items() if k != FSDP} == {k: v for k, v in original.items() if k != FSDP}


def test_revert_with_nothing_recorded(fixture_tree) -> None:
    root = fixture_tree("0.9")
    code, out = cli_json("revert", "--verl-root", root)
    assert code == ExitCode.REFUSED and "nothing recorded" in out["message"]
    code, out = cli_json("revert")
    assert code == ExitCode.REFUSED and "no patched tree is registered" in out["message"]


def test_lock_held_by_another_run(fixture_tree) -> None:
    root = fixture_tree("0.9")
    cli_json("apply", "--verl-root", root, "--backend", "fsdp")  # creates the state folder
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with locked(root / ".rlprobe-patch" / "lock", 5, "test"):
            holding.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    holding.wait(5)
    try:
        code, out = cli_json("apply", "--verl-root", root, "--backend", "megatron", "--lock-timeout", "0.2")
        assert code == ExitCode.LOCKED and "locked by another rlprobe-patch run" in out["message"]
    finally:
        release.set()
        thread.join()


def test_read_only_tree_refused(fixture_tree) -> None:
    root = fixture_tree("0.9")
    original = snapshot(root)
    # chattr +i makes the folder unwritable even for root (CI runs as root).
    subprocess.run(["chattr", "+i", str(root)], check=True)
    try:
        code, out = cli_json("apply", "--verl-root", root, "--backend", "fsdp")
    finally:
        subprocess.run(["chattr", "-i", str(root)], check=True)
    assert code == ExitCode.REFUSED and "cannot write" in out["message"]
    assert snapshot(root) == original


def test_symlinked_package_refused(fixture_tree, tmp_path: Path) -> None:
    real = fixture_tree("0.9")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "verl").symlink_to(real / "verl")
    code, out = cli_json("apply", "--verl-root", linked, "--backend", "fsdp")
    assert code == ExitCode.REFUSED and "symbolic link" in " ".join(out["details"])


def test_check_engine_patch_wording(fixture_tree) -> None:
    root = fixture_tree("0.9")
    result = cli("check-engine-patch", "--verl-root", root, "--backend", "megatron")
    target = root / MEGATRON
    assert result.exit_code == 1
    assert result.stdout.splitlines() == [
        f"FAIL: {target}",
        "  - missing markers: _ensure_debugger, _log_update_actor_step, DUMP_ON, update_actor_log.jsonl, "
        "PrecisionDebugger",
        "  - Megatron: expected _finish_dump_step or _dump_should_record hooks",
    ]
    result = cli("check-engine-patch", "--verl-root", root, "--backend", "fsdp")
    assert result.stdout.splitlines()[-1] == "  - FSDP: expected dump hooks in forward_backward_batch"
    assert cli("check-engine-patch", "--verl-root", root).exit_code == 2  # usage


def test_skill_checkers_json_mirrors_their_lines_and_codes(fixture_tree) -> None:
    """--json: the same verdict and exit code (0 PASS, 1 FAIL, 2 usage), the lines kept, and per-file checks."""
    root = fixture_tree("0.9")
    text = cli("check-engine-patch", "--verl-root", root, "--backend", "megatron")
    code, out = cli_json("check-engine-patch", "--verl-root", root, "--backend", "megatron")
    assert code == text.exit_code == 1
    assert out["ok"] is False and out["exit_code"] == 1
    assert out["lines"] == text.stdout.splitlines()
    assert out["checks"] == [
        {
            "status": "FAIL",
            "subject": str(root / MEGATRON),
            "errors": [
                "missing markers: _ensure_debugger, _log_update_actor_step, DUMP_ON, update_actor_log.jsonl, "
                "PrecisionDebugger",
                "Megatron: expected _finish_dump_step or _dump_should_record hooks",
            ],
        }
    ]
    assert cli("check-engine-patch", "--verl-root", root, "--json").exit_code == 2  # usage, as without --json

    assert cli("apply", "--verl-root", root, "--backend", "fsdp").exit_code == ExitCode.OK
    code, out = cli_json("check-engine-patch", "--verl-root", root, "--backend", "fsdp")
    assert (code, out["ok"]) == (0, True)
    assert out["checks"] == [{"status": "PASS", "subject": str(root / FSDP), "errors": []}]

    text = cli("check-consistency-patch", "--verl-root", root)
    code, out = cli_json("check-consistency-patch", "--verl-root", root)
    assert code == text.exit_code == 1 and out["ok"] is False
    assert out["lines"] == text.stdout.splitlines()
    assert [c["status"] for c in out["checks"]] == [line.split(":")[0] for line in out["lines"] if line[0] != " "]
    assert out["checks"][0] == {"status": "PASS", "subject": str(root / FSDP), "errors": []}
    assert out["checks"][-1]["subject"] == "request_id injection missing in both llm_server.py and agent_loop.py"


def test_every_command_takes_json(fixture_tree, tmp_path: Path) -> None:
    """Each command `rlprobe-patch --help` lists prints one JSON document with `ok` under --json."""
    root = fixture_tree("0.9")
    script = FIXTURES / "workflow" / "scripts" / "inference_sglang.sh"
    missing = tmp_path / "missing"
    cheap_calls = {  # the quickest call of each command that still does its work, or refuses
        "apply": ["--verl-root", missing, "--backend", "fsdp"],
        "verify": ["--verl-root", missing],
        "revert": ["--verl-root", missing],
        "status": ["--verl-root", root],
        "list": [],
        "demo": ["--offline", "--workdir", tmp_path / "demo"],
        "matrix": ["--patch", "no.such.patch"],
        "check-engine-patch": ["--verl-root", root, "--backend", "fsdp"],
        "check-consistency-patch": ["--verl-root", root],
        "check-dump": ["--actor", missing],
        "config": ["--mode", "training", "-o", tmp_path / "config.json", "--no-check"],
        "doctor": [],
        "detect": [script, "--no-trees"],
        "check-script": [script],
        "script": [script, "--dry-run"],
        "cluster": ["status", "--address", "127.0.0.1:1"],  # refused at once: nothing listens there
        "forget": [missing],
        # issue 42: report's JSON had no ok on success
        "report": [TESTS / "data" / "demo-consistency-vllm" / "capture", "-o", tmp_path / "r", "--max-k3-kl", "1"],
    }
    listing = cli("--help").stdout
    listed = [line.split()[0] for line in listing.split("Commands:\n", 1)[1].splitlines() if line.strip()]
    assert sorted(listed) == sorted(cheap_calls), "a new command needs its cheap call here"
    for name in listed:
        result = cli(name, *cheap_calls[name], "--json")
        assert result.exit_code != ExitCode.USAGE, (name, result.output)
        document = json.loads(result.stdout)
        assert isinstance(document, dict) and isinstance(document["ok"], bool), name
        assert document["ok"] == (result.exit_code == 0), (name, result.exit_code)


def test_python_discovery_without_importing(fixture_tree, tmp_path: Path) -> None:
    """--python finds the tree the training interpreter imports, without running its code."""
    root = fixture_tree("0.8")
    (root / "verl/__init__.py").write_text("raise SystemExit('verl was imported')\n")
    wrapper = tmp_path / "train-python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="{root}" exec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    code, out = cli_json("apply", "--python", wrapper, "--backend", "fsdp", "--dry-run")
    assert code == ExitCode.OK and out["tree"]["root"] == str(root)


def test_version_sources(fixture_tree) -> None:
    root = fixture_tree("0.9")
    (root / "verl/version/version").unlink()
    _code, out = cli_json("status", "--verl-root", root)
    assert out["trees"][0]["tree"]["version_source"] == "fingerprint"
    assert out["trees"][0]["tree"]["version"] == "0.9.1"
    meta = root / "verl-0.9.1.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: verl\nVersion: 0.9.1\n")
    _, out = cli_json("status", "--verl-root", root)
    assert out["trees"][0]["tree"]["version_source"] == "dist-info"


def test_list_and_version() -> None:
    _, out = cli_json("list")
    ids = [p["id"] for p in out["patches"]]
    assert ids == sorted(p.name for p in (FIXTURES.parent / "patches").iterdir() if (p / "patch.toml").is_file())
    assert {"verl.fsdp-engine", "verl.megatron-engine", "verl.request-id", "sglang.model-runner"} <= set(ids)
    request_id = next(p for p in out["patches"] if p["id"] == "verl.request-id")
    assert [s["target"] for s in request_id["sites"]] == [
        "verl/experimental/agent_loop/agent_loop.py",
        "verl/workers/rollout/llm_server.py",
        "verl/workers/rollout/llm_server.py",
        "verl/experimental/fully_async_policy/fully_async_rollouter.py",
    ]
    version = subprocess.run([sys.executable, "-m", "rlprobe_patch", "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.startswith("rlprobe-patch, version ")


def test_msprobe_config_is_baked_and_read_back(fixture_tree) -> None:
    root = fixture_tree("0.9")
    code, out = cli_json("apply", "--verl-root", root, "--backend", "fsdp", "--msprobe-config", "/cfg/actor.json")
    assert code == ExitCode.OK
    assert '"MSPROBE_ACTOR_CONFIG", "/cfg/actor.json"' in (root / FSDP).read_text()
    code, out = cli_json("status", "--verl-root", root)
    fsdp = next(p for p in out["trees"][0]["patches"] if p["id"] == "verl.fsdp-engine")
    assert fsdp["state"] == "applied" and fsdp["params"] == {"msprobe_config": "/cfg/actor.json"}
    code, out = cli_json("apply", "--verl-root", root, "--backend", "fsdp", "--msprobe-config", "/other.json")
    assert code == ExitCode.REFUSED and "revert first" in " ".join(out["details"])
    assert json.loads((root / ".rlprobe-patch/ledger.json").read_text())["records"][0]["params"] == {
        "msprobe_config": "/cfg/actor.json"
    }


def test_only_skip_and_unknown_ids(fixture_tree) -> None:
    root = fixture_tree("0.9")
    code, out = cli_json(
        "apply", "--verl-root", root, "--backend", "megatron", "--only", "verl.fsdp-engine", "--dry-run"
    )
    assert code == ExitCode.OK and [p["id"] for p in out["patches"]] == ["verl.fsdp-engine"]
    code, out = cli_json("apply", "--verl-root", root, "--backend", "fsdp", "--only", "verl.nope")
    assert code == ExitCode.REFUSED and "unknown patch id: verl.nope" in out["message"]
    code, out = cli_json("apply", "--verl-root", root, "--backend", "fsdp", "--skip", "verl.fsdp-engine")
    assert code == ExitCode.REFUSED and "no verl patch selected" in out["message"]


def test_mode_set_refuses_whole_when_a_target_is_missing(fixture_tree) -> None:
    """The fixture has engines only: the trainer files the consistency set needs are missing."""
    root = fixture_tree("0.9")
    original = snapshot(root)
    code, out = cli_json("apply", "--verl-root", root, "--backend", "fsdp", "--mode", "consistency")
    assert code == ExitCode.REFUSED
    assert any("verl/trainer/ppo/ray_trainer.py: missing" in d for d in out["details"])
    assert snapshot(root) == original and not (root / ".rlprobe-patch").exists()


def test_demo_consistency_options_go_together() -> None:
    """`--python` is the consistency demo's venv; `--offline` cannot run it (it needs verl, SGLang, msprobe);
    `--plant` is the vLLM rollout's."""
    for args in (
        ["--python", "/usr/bin/python3"],
        ["--consistency", "--offline"],
        ["--plant", "temperature"],
        ["--consistency", "--rollout", "sglang-standin", "--plant", "temperature"],
        ["--consistency", "--plant", "weights"],
    ):
        result = cli("demo", *args)
        assert result.exit_code == ExitCode.USAGE, result.output


def test_demo_plants_in_the_order_given_once_each() -> None:
    """`--plant` repeated: each cause once, in the order given; `all`: every plant of the demo; none: the broken
    layer."""
    from rlprobe_patch.cli.demo import _plants
    from rlprobe_patch.demo.vllm_consistency import PLANTS

    assert _plants(()) == ("layer",)
    assert _plants(("stale", "token", "stale")) == ("stale", "token")
    everything = ("layer", "stale", "template", "token", "dtype", "temperature", "top-p", "none")
    assert _plants(("token", "all")) == tuple(PLANTS) == everything
    # a run of its own each (dumps, compare, capture step), but the two the clean run's rollout serves
    assert {p.run for p in PLANTS.values()} == (set(PLANTS) - {"template", "token"}) | {"generate"}


def test_demo_ends_with_each_reports_verdict_cause_next_and_its_workdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 42, item 7: the demo had left its workdir in /tmp without saying so and never printed the verdict,
    the top cause or the next step. The printing (cli/demo.py), on the report `report --json` writes for the
    recorded demo (tests/data/demo-consistency-vllm); the demo itself stands in (its run: the runtime tests)."""
    from rlprobe_patch.demo import vllm_consistency

    data = TESTS / "data" / "demo-consistency-vllm"
    _, summary = cli_json("report", data / "capture", data / "compare", "-o", tmp_path / "report", "--floor-step", "1")
    work = tmp_path / "rlprobe-consistency-demo-x"
    result_of_demo = {"ok": True, "workdir": str(work), "plants": {"flip": {"report": {"summary": summary}}}}
    monkeypatch.setattr(vllm_consistency, "run_vllm_demo", lambda **kwargs: result_of_demo)
    said = cli("demo", "--consistency").output
    assert f"flip: verdict FAIL (report {tmp_path / 'report' / 'report.html'})" in said
    assert "  top cause: broken-layer (1.00): a broken layer; step 2: " in said
    assert "  next: look at Module.model.layers.1.mlp.down_proj.Linear.forward.0 first" in said
    assert said.strip().endswith(
        f"workdir: {work} (a temporary folder the demo made; it stays until you remove it: rm -rf {work})"
    )
    said = cli("demo", "--consistency", "--workdir", work).output
    assert said.strip().endswith(f"workdir: {work}")


def test_apply_on_verl_without_backend_is_a_usage_error(fixture_tree) -> None:
    """Exit 2 with one line saying what is missing (a JSON document with --json); nothing written."""
    root = fixture_tree("0.9")
    before = snapshot(root)
    result = cli("apply", "--verl-root", root)
    assert result.exit_code == ExitCode.USAGE
    assert result.stderr.splitlines()[0] == "error: --backend is required to patch verl (fsdp, fsdp2 or megatron)"
    code, out = cli_json("apply", "--verl-root", root)
    assert code == ExitCode.USAGE and out["error"] == "UsageError" and not out["ok"]
    assert snapshot(root) == before and not (root / ".rlprobe-patch").exists()


def test_a_usage_error_under_json_is_one_document_with_ok() -> None:
    """Issue 42: every command's --json carries ok, also when click itself refuses the command line (an unknown
    option, a missing argument): one JSON document on stdout, exit 2, for every command and subcommand."""
    from test_readme_commands import commands

    for name, _ in commands():
        result = cli(*name.split(), "--no-such-option", "--json")
        assert result.exit_code == ExitCode.USAGE, (name, result.output)
        document = json.loads(result.stdout)
        assert document["ok"] is False and document["error"] == "UsageError", (name, document)
        assert "--no-such-option" in document["message"], (name, document)
    result = cli("report", "--json")  # its PATHS missing
    assert result.exit_code == ExitCode.USAGE and json.loads(result.stdout)["ok"] is False
