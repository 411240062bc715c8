"""check-dump with pipeline parallelism: one micro-batch split into a forward step and a backward step.

Real: the actor's `update_actor_log.jsonl` lines, as the Megatron engine hooks wrote them in a
PP=2 x VPP=2 run (`tests/data/check-dump-megatron-pp2-vpp2`, see tests/data/README.md): on model
chunks before the last, 1F1B runs later forwards before an earlier micro-batch's backward, so that
micro-batch has a `["forward"]` step and a `["backward"]` step. Stand-ins: every `dump.json` (a
minimal msprobe layout, `{"data": {}}`) and the generate side (single-request vLLM prefill lines).
`tests/runtime/test_runtime_megatron_pp.py` runs the same check on a fresh run's real dumps.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from conftest import TESTS, cli, cli_json

from rlprobe_patch.base.errors import ExitCode

LOGS = TESTS / "data" / "check-dump-megatron-pp2-vpp2"


def _layout(tmp: Path, request_ids: list[str]) -> tuple[Path, Path, dict[tuple[int, int], dict]]:
    actor = tmp / "actor"
    shutil.copytree(LOGS, actor)
    lines = {}
    for log in actor.glob("*/update_actor_log.jsonl"):
        for text in log.read_text().splitlines():
            line = json.loads(text)
            lines[(line["rank"], line["step"])] = line
            rank_dir = actor / f"step{line['step']}" / f"rank{line['rank']}"
            rank_dir.mkdir(parents=True, exist_ok=True)
            (rank_dir / "dump.json").write_text('{"data": {}}')
    gen = tmp / "generate" / "4321"
    records = []
    for step, rid in enumerate(request_ids):
        (gen / f"step{step}" / "rank0").mkdir(parents=True)
        (gen / f"step{step}" / "rank0" / "dump.json").write_text('{"data": {}}')
        request = {"request_id": f"{rid}-1a2b3c4d", "type": "new", "tokens": 8}
        records.append(
            {"source": "dispatch_logger", "rank": 0, "step": step, "phase": "prefill", "requests": [request]}
        )
    (gen / "dispatch_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return actor, tmp / "generate", lines


def test_each_stage_and_chunk_pairs_its_forward_step(tmp_path: Path) -> None:
    actor, generate, lines = _layout(tmp_path, ["v1-0-0", "v1-1-0", "v1-1-2", "v1-1-3"])
    code, out = cli_json("check-dump", "--actor", actor, "--generate", generate)
    assert code == ExitCode.OK, out["problems"]
    assert out["unpaired"] == []
    got = sorted((p["request_id"], p["actor"]["rank"], p["actor"]["step"]) for p in out["pairs"])
    # (rank, step) of the steps whose passes include the forward, read off the log files by hand:
    # rank 0 splits every update micro-batch on both chunks, rank 1 on chunk 0 only.
    assert got == sorted(
        [("v1-0-0", 0, 0), ("v1-0-0", 0, 2), ("v1-0-0", 1, 0), ("v1-0-0", 1, 2)]
        + [("v1-1-0", 0, 8), ("v1-1-0", 0, 10), ("v1-1-0", 1, 8), ("v1-1-0", 1, 10)]
        + [("v1-1-2", 0, 12), ("v1-1-2", 0, 16), ("v1-1-2", 1, 12), ("v1-1-2", 1, 16)]
        + [("v1-1-3", 0, 14), ("v1-1-3", 0, 18), ("v1-1-3", 1, 14), ("v1-1-3", 1, 17)]
    )
    for pair in out["pairs"]:
        line = lines[(pair["actor"]["rank"], pair["actor"]["step"])]
        assert {k: pair[k] for k in ("phase", "micro_batch", "pp_rank", "vp_stage", "passes")} == {
            k: line[k] for k in ("phase", "micro_batch", "pp_rank", "vp_stage", "passes")
        }
    backward_only = sum(1 for line in lines.values() if line["passes"] == ["backward"])
    assert backward_only == 12  # 8 on rank 0, 4 on rank 1 (padding micro-batch 1 included)
    assert f"{backward_only} actor step(s) hold only the backward" in " ".join(out["notes"])


def test_a_backward_step_never_stands_in_for_a_missing_forward(tmp_path: Path) -> None:
    actor, generate, lines = _layout(tmp_path, ["v1-1-0"])
    # rank 0, chunk 1 of update micro-batch 0: forward in step 10, backward in step 13
    assert lines[(0, 10)]["passes"] == ["forward"] and lines[(0, 13)]["passes"] == ["backward"]
    shutil.rmtree(actor / "step10" / "rank0")
    code, out = cli_json("check-dump", "--actor", actor, "--generate", generate)
    assert code == ExitCode.VERIFY_FAILED
    assert any("logged step 10 rank 0 has no step10/rank0/dump.json" in p for p in out["problems"])
    assert [(u["request_id"], u["reason"]) for u in out["unpaired"]] == [
        (
            "v1-1-0",
            "rank 0 (pipeline stage 0 chunk 1): step 13 holds only the backward of update_actor micro-batch 0 "
            "and its forward step 10 has no dump.json",
        )
    ]
    assert sorted((p["actor"]["rank"], p["actor"]["step"]) for p in out["pairs"]) == [(0, 8), (1, 8), (1, 10)]


def test_text_output_names_the_stage_and_chunk(tmp_path: Path) -> None:
    actor, generate, _ = _layout(tmp_path, ["v1-1-0"])
    result = cli("check-dump", "--actor", str(actor), "--generate", str(generate))
    assert result.exit_code == ExitCode.OK, result.output
    assert f"actor {actor / 'step10' / 'rank0' / 'dump.json'} [pp_rank 0, vp_stage 1]" in result.output
    assert "hold only the backward" in result.output


def test_a_paired_dump_cut_short_fails_the_check(tmp_path: Path) -> None:
    """Issue 42, item 5 (fast, on the stand-in layout; on the demo's real dumps: test_first_path_runtime.py): a
    paired dump.json cut in half had been "dumps OK", exit 0; it fails, named."""
    actor, generate, _ = _layout(tmp_path, ["v1-0-0"])
    code, out = cli_json("check-dump", "--actor", actor, "--generate", generate)
    assert code == ExitCode.OK, out["problems"]
    cut = Path(out["pairs"][0]["generate"]["dump"])
    cut.write_text('{"data": {"Module.mo')
    code, out = cli_json("check-dump", "--actor", actor, "--generate", generate)
    assert code == ExitCode.VERIFY_FAILED and out["ok"] is False
    assert [p for p in out["problems"] if p.startswith(f"{cut}: not a whole msprobe dump.json")], out["problems"]
