"""The vLLM demo's runs, engine sessions and captures (`demo.vllm_consistency`), on small inputs written here: what
the real chain's tests (tests/runtime/test_runtime_consistency_demo.py) take as given."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rlprobe_patch.demo.model import DemoModel
from rlprobe_patch.demo.vllm_consistency import (
    CHANGED_AT,
    CLEAN,
    FLOOR,
    PLANTS,
    _runs,
    _sessions,
    _trainer_rows,
    _write_step,
    changed_token,
    split_dumps,
)
from rlprobe_patch.report.capture_format import read_capture

PROMPTS = [
    {"request_id": "x", "text": "a", "input_ids": [1, 2, 30, 31, 3], "plain_ids": [30, 31]},
    {"request_id": "y", "text": "b", "input_ids": [1, 2, 40, 3], "plain_ids": [40]},
]


def test_the_token_plant_changes_one_position_within_the_vocabulary() -> None:
    responses = {"a": [0, 1, 2, 3, 4, 5], "b": [9, 9, 9, 255], "c": [7, 7]}  # "c" ends before the position
    changed = changed_token(responses, vocab=256)
    for rid, ids in responses.items():
        moved = [i for i, (x, y) in enumerate(zip(ids, changed[rid])) if x != y]
        assert moved == ([CHANGED_AT] if len(ids) > CHANGED_AT else []) and len(changed[rid]) == len(ids)
        assert all(0 <= t < 256 for t in changed[rid])
    assert changed["b"][CHANGED_AT] == 127  # (255 + 128) % 256


def test_every_run_has_request_ids_of_its_own_and_the_plants_that_reuse_the_clean_run_have_none() -> None:
    runs = _runs(tuple(PLANTS), PROMPTS)
    own = {p.run for p in PLANTS.values()}
    assert set(runs) == {CLEAN, FLOOR} | own
    ids = [p["request_id"] for r in runs.values() for p in r.prompts]
    assert len(ids) == len(set(ids)) == 2 * len(runs)  # unique across runs: the records and dumps join by id
    assert {n for n, r in runs.items() if r.dumped} == {CLEAN, "layer", "stale"}
    assert runs["temperature"].sampling["temperature"] == 0.7 and runs["top-p"].sampling["top_p"] == 0.8
    assert runs["none"].sampling["seed"] == 4321 and runs[FLOOR].sampling["seed"] != runs[CLEAN].sampling["seed"]
    assert runs["layer"].broken_layer and not runs[CLEAN].broken_layer
    assert (runs["stale"].session, runs["dtype"].session) == ("sample", "bfloat16")
    assert {n for n, r in runs.items() if r.stale} == {"stale"}


def test_the_sessions_dump_one_prefill_at_a_time_and_sample_batched(tmp_path: Path) -> None:
    runs = _runs(tuple(PLANTS), PROMPTS)
    model = DemoModel(tmp_path / "m", True, "", PROMPTS, 64, 8, 40)
    sessions = _sessions(runs, model, tmp_path)
    assert list(sessions) == ["dump", "sample", "bfloat16"]
    dump = sessions["dump"]
    assert dump["max_num_seqs"] == 1 and {r["kind"] for r in dump["runs"]} == {"prefill"}
    assert [r["name"] for r in dump["runs"]] == [CLEAN, "layer", "stale"]
    assert json.loads(Path(dump["dump_config"]).read_text())["task"] == "statistics"
    sample = sessions["sample"]
    assert sample["max_num_seqs"] == 2 and sample["record"] and sample.get("dump_config") is None
    assert all(r["kind"] == "sample" and r["rescore"] for r in sample["runs"])
    # the stale run last in both sessions, on the stale checkpoint loaded into the running engine; the others on the
    # session's own weights
    stale = str(tmp_path / "model-stale")
    assert dump["runs"][-1]["model_dir"] == sample["runs"][-1]["model_dir"] == stale
    assert sample["runs"][-1]["name"] == "stale" and sample["model_dir"] == dump["model_dir"] == str(model.path)
    assert all("model_dir" not in r for r in dump["runs"][:-1] + sample["runs"][:-1])
    # the fingerprints of the weights each sampled run ran on; the dumped prefills write none
    assert not any("fingerprints" in r for r in dump["runs"])
    written = {r["name"]: Path(r["fingerprints"]).name for n in ("sample", "bfloat16") for r in sessions[n]["runs"]}
    assert written == {
        r.name: "rollout-sample.rlprobe-weights.json" for r in runs.values() if r.session == "sample"
    } | {
        "stale": "rollout-stale.rlprobe-weights.json",
        "dtype": "rollout-bfloat16.rlprobe-weights.json",
    }
    assert sessions["bfloat16"]["dtype"] == "bfloat16" and sessions["sample"]["dtype"] == "float32"
    assert next(r for r in sample["runs"] if r["name"] == "layer")["plant"] == "layer"


def test_the_stale_runs_passes_leave_the_dump_session_with_their_dispatch_lines(tmp_path: Path) -> None:
    """The dump session dumps the stale run's prefills last, on the weights loaded for them: their step folders and
    dispatch-log lines go to a folder of their own (vLLM's `-<8 hex>` suffix on the ids), the others stay."""
    session, dest = tmp_path / "dump-session", tmp_path / "dump-stale"
    sent = [["a-0123abcd"], ["b-0123abcd"], ["s1-89abcdef"], ["s2-89abcdef"]]
    lines = []
    for step, ids in enumerate(sent):
        (session / f"step{step}" / "rank0").mkdir(parents=True)
        (session / f"step{step}" / "rank0" / "dump.json").write_text(json.dumps({"data": {"step": step}}))
        lines.append(json.dumps({"step": step, "dump": f"step{step}/rank0/dump.json", "request_ids": ids}))
    (session / "77").mkdir()
    (session / "77" / "dispatch_log.jsonl").write_text("".join(f"{line}\n" for line in lines))
    assert split_dumps(session, dest, {"s1", "s2"}) == 2
    assert sorted(p.name for p in session.iterdir()) == ["77", "step0", "step1"]
    assert sorted(p.name for p in dest.iterdir()) == ["77", "step2", "step3"]
    assert (session / "77" / "dispatch_log.jsonl").read_text().splitlines() == lines[:2]
    assert (dest / "77" / "dispatch_log.jsonl").read_text().splitlines() == lines[2:]
    for line in lines[2:]:  # each line's dump where it says, relative to its folder
        record = json.loads(line)
        assert json.loads((dest / record["dump"]).read_text())["data"]["step"] == record["step"]
    assert split_dumps(session, dest, {"s1", "s2"}) == 0  # nothing left to move


def test_the_template_and_token_plants_score_the_clean_runs_responses_otherwise() -> None:
    runs = _runs(("template", "token"), PROMPTS)
    runs[CLEAN].result["responses"] = {p["request_id"]: [5, 6, 7, 8] for p in runs[CLEAN].prompts}
    template = _trainer_rows("template", runs, vocab=64)
    token = _trainer_rows("token", runs, vocab=64)
    assert [r["input_ids"] for r in template] == [[30, 31], [40]]  # the text alone, no template
    assert [r["input_ids"] for r in token] == [[1, 2, 30, 31, 3], [1, 2, 40, 3]]
    assert all(r["response"] == [5, 6, 7, 8 + 32] for r in token)


def test_a_step_of_the_demos_capture_holds_both_sides_the_prompt_ids_and_the_engines_rescore(tmp_path: Path) -> None:
    runs = _runs((), PROMPTS)
    run = runs[CLEAN]
    ids = [p["request_id"] for p in run.prompts]
    run.result = {
        "responses": {ids[0]: [5, 6, 7], ids[1]: [8]},
        "logprobs": {ids[0]: [-0.1, -0.2, -0.3], ids[1]: [-0.4]},
        "prefill_logprobs": {ids[0]: [-0.11, -0.2, -0.3], ids[1]: [-0.4]},
        "dtype": "float32",
    }
    rows = [
        {
            "request_id": p["request_id"],
            "input_ids": p["input_ids"],
            "response": run.result["responses"][p["request_id"]],
        }
        for p in run.prompts
    ]
    old = {ids[0]: [-0.1, -0.25, -0.3], ids[1]: [-0.5]}
    _write_step(tmp_path, 1, run, rows, old, rollout_dtype="bfloat16", prefill=True, source="here")
    (path,) = tmp_path.glob("*.npz")
    batch = read_capture(path)
    assert batch.request_ids == ids and batch.mask.tolist() == [[True] * 3, [True, False, False]]
    assert batch.prompt(0).tolist() == [1, 2, 30, 31, 3] and batch.prompt(1).tolist() == [1, 2, 40, 3]
    np.testing.assert_allclose(batch.prefill[batch.mask], [-0.11, -0.2, -0.3, -0.4], rtol=1e-6)
    np.testing.assert_allclose(batch.training[batch.mask], [-0.1, -0.25, -0.3, -0.5], rtol=1e-6)
    assert batch.provenance == {"training_dtype": "float32", "rollout_dtype": "bfloat16", "training_temperature": 1.0}
    assert batch.sampling == {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs_mode": "processed_logprobs"}


@pytest.mark.parametrize(
    ("body", "said"),
    [
        # a session that fails as the vLLM driver says it (the weight load's check: a traceback in its output)
        (
            "raise RuntimeError('after loading /w/model-stale, a packed layer of [lm_head] computes with other "
            "weights than it holds (relative difference 0.0073)')",
            "RuntimeError: after loading /w/model-stale, a packed layer of [lm_head] computes with other weights",
        ),
        # a driver that dies before writing anything
        ("import sys; sys.stderr.write('Killed\\n'); sys.exit(137)", "Killed"),
    ],
)
def test_a_failed_engine_session_stops_the_demo_with_one_line(body: str, said: str, tmp_path: Path) -> None:
    """A driver that fails (its own error, or a crash with nothing written) stops the demo with exit 4 and one line
    naming the session and the error's last line; the traceback's lines follow as details."""
    import sys

    from rlprobe_patch.base.errors import ExitCode
    from rlprobe_patch.demo.consistency import DemoError, drive

    driver = tmp_path / "driver.py"
    driver.write_text(
        "import json, sys, traceback\n"
        "out = sys.argv[sys.argv.index('--out') + 1]\n"
        "try:\n" + "".join(f"    {line}\n" for line in body.split("; ")) + "except Exception:\n"
        "    json.dump({'ok': False, 'error': traceback.format_exc()}, open(out, 'w'))\n"
    )
    with pytest.raises(DemoError) as caught:
        drive(Path(sys.executable), tmp_path, "session-sample", "--plan", "p.json", driver=driver)
    error = caught.value
    assert error.exit_code == ExitCode.VERIFY_FAILED
    assert error.message.startswith("the session-sample side failed: ") and "\n" not in error.message
    assert said in error.message
    if "raise" in body:
        assert error.details[0].startswith("Traceback")
