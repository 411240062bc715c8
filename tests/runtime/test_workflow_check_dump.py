"""`rlprobe-patch check-dump` on dumps written by real msprobe (CPU) from the patched FSDP hooks.

Both sides are real msprobe dumps of verl 0.9.1's `FSDPEngineWithLMHead` patched through
`rlprobe-patch apply --python`: the actor side as the hook writes it
(`actor/step{N}/rank0/dump.json` + `actor/<pid>/update_actor_log.jsonl`), the generate side
dumped with `dump_path=generate/<pid>` so that it has the DispatchLogger layout
(`generate/<pid>/step{N}/rank0/`), plus the `dispatch_log.jsonl` the DispatchLogger would
write (section P7's format), with vLLM's `-<8 hex>` suffix on the ids.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import cli, cli_json

from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.dumps.request_ids import strip_vllm_suffix
from rlprobe_patch.workflow.check_dump import check_dumps
from runtime import venvs
from runtime.shared_runs import drive_fsdp, fsdp_actor_dump, once_per_session

GEN_PID = "43210"


def _dispatch(record_step: int, requests: list[str], phase: str = "prefill") -> dict:
    return {
        "source": "dispatch_logger",
        "timestamp": 1.0,
        "pid": int(GEN_PID),
        "rank": 0,
        "step": record_step,
        "phase": phase,
        "total_num_scheduled_tokens": 8 * len(requests),
        "requests": [
            {"request_id": r, "type": "new" if phase == "prefill" else "cached", "tokens": 8} for r in requests
        ],
    }


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The actor side: the session's shared run of the patched engine (`shared_runs.fsdp_actor_dump`); the generate
    side: the same engine run again, dumping to generate/<pid>, with the dispatch log a DispatchLogger would write.
    Made once per session (the module's tests may run on both workers)."""
    actor = fsdp_actor_dump(tmp_path_factory)

    def build(tmp: Path) -> None:
        shutil.copytree(actor, tmp / "actor")
        shutil.copytree(actor.parent / "model", tmp / "model")  # the generate side runs the actor's checkpoint
        with pytest.MonkeyPatch.context() as monkeypatch, venvs.using("0.9.1") as python:
            monkeypatch.setenv("RLPROBE_PATCH_STATE_HOME", str(tmp / "state"))
            code, out = cli_json("apply", "--python", python, "--backend", "fsdp2", "--only", "verl.fsdp-engine")
            assert code == ExitCode.OK, out
            drive_fsdp(python, tmp, "generate", tmp / "generate" / GEN_PID)
            code, out = cli_json("revert", "--python", python)
            assert code == ExitCode.OK, out
        gen = tmp / "generate" / GEN_PID
        for extra in gen.glob("*/update_actor_log.jsonl"):  # the engine's own log: not part of a rollout dump
            shutil.rmtree(extra.parent)
        lines = [
            _dispatch(0, ["req-0-1a2b3c4d"]),
            _dispatch(1, ["req-1-deadbeef"]),
            _dispatch(2, ["req-0-1a2b3c4d", "req-1-deadbeef"], phase="decode"),
            _dispatch(3, ["req-2-00000000", "req-3-11111111"]),  # a batched prefill: not comparable
        ]
        (gen / "dispatch_log.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))

    return once_per_session(tmp_path_factory, "check-dump-dumps", build)


def copy(dumps: Path, tmp_path: Path) -> tuple[Path, Path]:
    shutil.copytree(dumps / "actor", tmp_path / "actor")
    shutil.copytree(dumps / "generate", tmp_path / "generate")
    return tmp_path / "actor", tmp_path / "generate"


def test_pairs_found_through_request_ids(dumps: Path, tmp_path: Path) -> None:
    actor, generate = copy(dumps, tmp_path)
    code, out = cli_json("check-dump", "--actor", actor, "--generate", generate)
    assert code == ExitCode.OK, out["problems"]
    pairs = {(p["request_id"], p["sent_as"]): (p["generate"], p["actor"]) for p in out["pairs"]}
    assert set(pairs) == {("req-0", "req-0-1a2b3c4d"), ("req-1", "req-1-deadbeef")}
    gen0, act0 = pairs[("req-0", "req-0-1a2b3c4d")]
    assert gen0["dump"] == str(generate / GEN_PID / "step0" / "rank0" / "dump.json")
    assert act0["dump"] == str(actor / "step0" / "rank0" / "dump.json")
    assert pairs[("req-1", "req-1-deadbeef")][1]["step"] == 1
    assert out["actor"]["steps"] == [0, 1] and out["actor"]["log_lines"] == 2
    assert any("several requests" in n for n in out["notes"])


def test_documented_step_underscore_layout(dumps: Path, tmp_path: Path) -> None:
    actor, generate = copy(dumps, tmp_path)
    for step in actor.glob("step*"):
        step.rename(actor / f"step_{step.name[4:]}")
        (actor / f"step_{step.name[4:]}" / "rank0").rename(actor / f"step_{step.name[4:]}" / "rank_0")
    report = check_dumps(actor, generate)
    assert report.ok, report.problems
    assert len(report.pairs) == 2


def test_missing_pieces_are_reported_precisely(dumps: Path, tmp_path: Path) -> None:
    actor, generate = copy(dumps, tmp_path)
    shutil.rmtree(actor / "step1")
    (generate / GEN_PID / "step0" / "rank0" / "dump.json").unlink()
    code, out = cli_json("check-dump", "--actor", actor, "--generate", generate)
    assert code == ExitCode.VERIFY_FAILED
    problems = "\n".join(out["problems"])
    assert f"logged step 1 rank 0 has no step1/rank0/dump.json under {actor}" in problems
    assert f"prefill step 0 rank 0 of req-0-1a2b3c4d has no {GEN_PID}/step0/rank0/dump.json" in problems
    assert out["pairs"] == []

    actor, generate = copy(dumps, tmp_path / "again")
    (generate / GEN_PID / "dispatch_log.jsonl").unlink()
    for log in actor.glob("*/update_actor_log.jsonl"):
        log.write_text(log.read_text().replace("req-1", "req-9"))
    code, out = cli_json("check-dump", "--actor", actor, "--generate", generate)
    assert code == ExitCode.VERIFY_FAILED
    assert any("no dispatch_log.jsonl" in p for p in out["problems"])

    actor, generate = copy(dumps, tmp_path / "third")
    for log in actor.glob("*/update_actor_log.jsonl"):
        log.write_text(log.read_text().replace("req-1", "req-9"))
    code, out = cli_json("check-dump", "--actor", actor, "--generate", generate)
    assert any(
        "request req-1 (sent as req-1-deadbeef) is in no update_actor_log.jsonl line" in p for p in out["problems"]
    )
    assert [p["request_id"] for p in out["pairs"]] == ["req-0"]

    empty = tmp_path / "empty"
    empty.mkdir()
    code, out = cli_json("check-dump", "--actor", empty)
    assert code == ExitCode.VERIFY_FAILED
    assert any("no update_actor_log.jsonl" in p for p in out["problems"])
    code, out = cli_json("check-dump", "--actor", tmp_path / "nope")
    assert code == ExitCode.REFUSED


def test_compare_runs_msprobe_on_each_pair(dumps: Path, tmp_path: Path) -> None:
    actor, generate = copy(dumps, tmp_path)
    python = venvs.ensure_runtime_venv("0.9.1")
    code, out = cli_json(
        "check-dump",
        "--actor",
        actor,
        "--generate",
        generate,
        "--compare",
        "--compare-output",
        tmp_path / "cmp",
        "--python",
        python,
    )
    assert code == ExitCode.OK, out["problems"]
    for pair in out["pairs"]:
        result = pair["compare"]
        assert result["ok"] and result["files"], result
        csv = Path(result["output"]) / result["files"][0]
        assert "Module." in csv.read_text()  # msprobe's per-module rows
        # statistics mode (no Cosine column): msprobe's own Result per row still gives a verdict
        assert result["mode"] == "statistics" and result["agree"] is True and result["matched"] > 0, result
        assert set(result["last_output"]) == {"name", "result", "max_diff"}, result


def test_strip_vllm_suffix() -> None:
    assert strip_vllm_suffix("0f3a-req-1a2b3c4d") == "0f3a-req"
    assert strip_vllm_suffix("abcdef0123456789") == "abcdef0123456789"
    assert strip_vllm_suffix("req-XYZ12345") == "req-XYZ12345"
    # prefill/decode disaggregation: `_P` / `_D`, before or after the hex suffix
    for raw in ("0f3a-req_P", "0f3a-req_D", "0f3a-req_P-1a2b3c4d", "0f3a-req-1a2b3c4d_D"):
        assert strip_vllm_suffix(raw) == "0f3a-req", raw
    assert strip_vllm_suffix("req_PD") == "req_PD"


def test_usage(tmp_path: Path) -> None:
    result = cli("check-dump", "--actor", str(tmp_path), "--compare", "--json")
    assert result.exit_code == ExitCode.USAGE
