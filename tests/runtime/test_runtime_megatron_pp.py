"""The Megatron hooks on every pipeline stage (PP = 2, and virtual pipeline: 2 model chunks per rank).

Two processes on gloo run megatron-core 0.16.1's real `forward_backward_pipelining_without_interleaving`
(1F1B) or `forward_backward_pipelining_with_interleaving` (VPP), with the hook code exactly as
`rlprobe-patch apply` wrote it into real verl files: the Megatron engine of 0.8.0 and 0.9.1, the
legacy Megatron actor of 0.7.1. Each run makes a log-prob call and then an update call. See
`tests/runtime/megatron_driver.py` (`--pp`, `--vpp`) and `tests/runtime/legacy_driver.py`.

What a step is: one micro-batch on one model chunk. On the last stage it holds that micro-batch's
forward, loss and backward. On a stage before the last, 1F1B runs the forward of later
micro-batches before the backward of an earlier one, and one msprobe debugger per process holds
one open step: there the forward is a step and the backward (from the gradient reaching the
chunk's output to the end of the chunk's backward) a step of its own, each labelled in
`update_actor_log.jsonl` (`micro_batch`, `vp_stage`, `pp_rank`, `phase`, `passes`). With one
micro-batch per call (the consistency collection's batch sizes) every stage has one step per
micro-batch. Before revision 2, a stage before the last closed a step when the next micro-batch
arrived, so the earlier micro-batch's backward was dumped inside the next one's step, under
that one's log line.

verl 0.9.1's dumped engine run, per VPP, is made once per test session (`shared_engine_run`) and
read by the stage checks and by check-dump's pairing test (on a copy of its dump).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from conftest import TESTS, cli_json, unpack_verl

from rlprobe_patch.base.errors import ExitCode
from runtime import venvs
from runtime.shared_runs import once_per_session

RUNTIME = TESTS / "runtime"
ENGINE_TARGET = "verl/workers/engine/megatron/transformer_impl.py"
LEGACY_TARGET = "verl/workers/actor/megatron_actor.py"
SWITCHES = ("DUMP_ON", "DUMP_PHASE", "MSPROBE_ACTOR_CONFIG")
TIMEOUT_S = 240  # both ranks, imports included (about 10 s on 2 cores); a hang fails the test


def run_ranks(python: Path, driver: list[str], tmp: Path, name: str, world: int = 2, **env: str) -> list[dict]:
    """Start one driver process per rank, wait for all; a rank still running after TIMEOUT_S is a hang."""
    store = tmp / f"store-{name}"
    clean = {k: v for k, v in os.environ.items() if k not in SWITCHES}
    procs = []
    for rank in range(world):
        out = tmp / f"{name}-r{rank}.json"
        cmd = [str(python), *driver, "--rank", str(rank), "--world-size", str(world), "--store", str(store)]
        procs.append(
            (
                out,
                subprocess.Popen(
                    [*cmd, "--out", str(out)],
                    env={**clean, **env},
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                ),
            )
        )
    deadline = time.monotonic() + TIMEOUT_S
    try:
        for _, proc in procs:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        for _, proc in procs:
            proc.kill()
        pytest.fail(f"{name}: a rank still ran after {TIMEOUT_S}s (a hang)")
    results = []
    for rank, (out, proc) in enumerate(procs):
        stderr = proc.stderr.read() if proc.stderr else ""
        assert out.is_file(), (rank, stderr[-3000:])
        result = json.loads(out.read_text())
        assert proc.returncode == 0 and result["ok"], (rank, result.get("error"), stderr[-2000:])
        results.append(result)
    return results


def msprobe_config(tmp: Path, name: str, ranks: list[int] | None = None) -> dict[str, str]:
    config = tmp / f"config-{name}.json"
    config.write_text(
        json.dumps(
            {
                "task": "statistics",
                "dump_path": str(tmp / f"dump-{name}"),
                "rank": ranks or [],
                "step": [],
                "level": "mix",
                "async_dump": False,
            }
        )
    )
    return {"DUMP_ON": "1", "DUMP_PHASE": "all", "MSPROBE_ACTOR_CONFIG": str(config)}


ALWAYS = (
    "dumped",
    "one_unit_per_step",  # never two micro-batches (or chunks) in one step
    "no_work_outside_steps",  # every forward, loss and gradient of a dumped call is in a step
    "every_unit_dumped",
    "backward_in_a_step",
    "closed_after_last_work",  # the step holding a unit's last work (its backward) closes after it ...
    "closed_before_next_action",  # ... and before the schedule's next forward or backward
    "dump_json_per_step",
    "log_line_per_step",
    "log_lines_match",  # micro_batch, vp_stage, pp_rank, phase, passes as observed
    "steps_distinct",
)


def check_stages(results: list[dict], *, vpp: int, micro_batches: int) -> None:
    last = len(results) - 1
    for rank, result in enumerate(results):
        failed = [name for name in ALWAYS if not result["checks"][name]]
        assert not failed, (rank, failed, result["pp_steps"])
        units = result["per_unit"]
        assert len(units) == 2 * micro_batches * vpp  # both calls, every micro-batch on every chunk
        for unit in units:
            if unit["phase"] == "log_prob":
                assert unit["passes"] == [["forward"]], unit
            elif rank == last and unit["chunk"] == vpp - 1:
                # the last stage: forward, loss and backward in one step, closed after the backward
                assert unit["passes"] == [["forward", "backward"]], unit
            elif micro_batches == 1 and vpp == 1:
                assert unit["passes"] == [["forward", "backward"]], unit
            else:
                assert unit["passes"] in ([["forward", "backward"]], [["forward"], ["backward"]]), unit
        if micro_batches > 1 and rank < last:
            # 1F1B: a stage before the last runs a later forward before this backward
            assert any(u["passes"] == [["forward"], ["backward"]] for u in units if u["phase"] == "update_actor")
        for row in result["pp_steps"]:
            assert (
                row["dump"]["backward_keys"] > 0 if "backward" in row["passes"] else row["dump"]["backward_keys"] == 0
            )


@pytest.fixture(scope="module")
def megatron_python() -> Path:
    return venvs.ensure_megatron_venv()


def micro_batches_for(vpp: int) -> int:
    return 4 if vpp > 1 else 3  # the interleaved schedule needs a multiple of PP


def engine_driver(patched: Path, vpp: int, *extra: str) -> list[str]:
    """The Megatron engine driver on PP = 2 (x `vpp` chunks): a log-prob call, then an update call."""
    driver = [str(RUNTIME / "megatron_driver.py"), "--patched-file", str(patched)]
    driver += ["--pp", "2", "--vpp", str(vpp), "--phase-run", "both", "--calls", "2"]
    return driver + ["--micro-batches", str(micro_batches_for(vpp)), *extra]


# The shared run's batches: V1-shaped micro-batches of one sample (megatron_driver.make_v1_batch), so each
# step of a dumped call holds one request (what check-dump pairs).
V1_BATCH = ("--v1-batch", "--micro-batch-size", "1")


def shared_engine_run(factory: pytest.TempPathFactory, python: Path, vpp: int) -> tuple[Path, list[dict]]:
    """verl 0.9.1's Megatron engine patched (`apply --backend megatron --worker-impl engine`) and driven on
    PP = 2 (x `vpp` chunks) with `V1_BATCH`, dumping every phase (`msprobe_config`): one run per test session
    (`once_per_session`), the "on" run of test_engine_hooks_on_every_pipeline_stage and the actor side of
    test_check_dump_pairs_the_forward_step_of_split_micro_batches. Its folder (the patched tree `verl-0.9.1/`,
    the dump `dump-on/`), to read only, and each rank's result."""

    def build(folder: Path) -> None:
        root = unpack_verl("0.9.1", folder / "verl-0.9.1")
        code, out = cli_json("apply", "--verl-root", root, "--backend", "megatron", "--worker-impl", "engine")
        assert code == ExitCode.OK, out
        driver = engine_driver(root / ENGINE_TARGET, vpp, *V1_BATCH)
        run_ranks(python, driver, folder, "on", **msprobe_config(folder, "on"))

    folder = once_per_session(factory, f"megatron-engine-pp{vpp}", build)
    return folder, [json.loads((folder / f"on-r{rank}.json").read_text()) for rank in (0, 1)]


@pytest.mark.parametrize(("version", "vpp"), [("0.8.0", 1), ("0.9.1", 1), ("0.9.1", 2)])
def test_engine_hooks_on_every_pipeline_stage(
    real_tree, megatron_python: Path, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, version: str, vpp: int
) -> None:
    """0.9.1: the session's shared run (`shared_engine_run`, V1 micro-batches of one sample) and its undumped
    twin; 0.8.0: runs of its own on V0 batches (top-level request ids, micro-batches of two samples)."""
    micro_batches = micro_batches_for(vpp)
    if version == "0.9.1":
        folder, on = shared_engine_run(tmp_path_factory, megatron_python, vpp)
        driver = engine_driver(folder / "verl-0.9.1" / ENGINE_TARGET, vpp, *V1_BATCH)
    else:
        root = real_tree(version)
        code, out = cli_json("apply", "--verl-root", root, "--backend", "megatron", "--worker-impl", "engine")
        assert code == ExitCode.OK, out
        driver = engine_driver(root / ENGINE_TARGET, vpp)
        on = run_ranks(megatron_python, driver, tmp_path, "on", **msprobe_config(tmp_path, "on"))
    off = run_ranks(megatron_python, driver, tmp_path, "off")
    for rank in (0, 1):
        assert not off[rank]["checks"]["dumped"]
        assert on[rank]["losses"] == off[rank]["losses"]  # dumping does not change the numbers
        assert on[rank]["grad_norm"] == off[rank]["grad_norm"]
        schedule = "with_interleaving" if vpp > 1 else "without_interleaving"
        assert on[rank]["real"]["schedule"].endswith(f"forward_backward_pipelining_{schedule}")
    assert len(on[1]["losses"][0]) == micro_batches and on[0]["losses"] == [[], []]  # the loss: last stage only
    check_stages(on, vpp=vpp, micro_batches=micro_batches)


def test_engine_one_micro_batch_and_an_excluded_rank(real_tree, megatron_python: Path, tmp_path: Path) -> None:
    """One micro-batch per call (the consistency collection): one step per stage, forward to backward.
    A rank the msprobe config leaves out writes neither dumps nor log lines."""
    root = real_tree("0.9.1")
    assert cli_json("apply", "--verl-root", root, "--backend", "megatron", "--worker-impl", "engine")[0] == ExitCode.OK
    driver = [str(RUNTIME / "megatron_driver.py"), "--patched-file", str(root / ENGINE_TARGET)]
    driver += ["--pp", "2", "--phase-run", "both", "--calls", "2", "--micro-batches", "1"]
    on = run_ranks(megatron_python, driver, tmp_path, "one", **msprobe_config(tmp_path, "one"))
    check_stages(on, vpp=1, micro_batches=1)

    only = run_ranks(megatron_python, driver, tmp_path, "only1", **msprobe_config(tmp_path, "only1", ranks=[1]))
    assert only[0]["update_actor_log"]["lines"] == [] and not any(r["dump"] for r in only[0]["pp_steps"])
    assert not list((tmp_path / "dump-only1").glob("step*/rank0"))
    assert only[1]["checks"]["log_lines_match"] and only[1]["checks"]["dump_json_per_step"]
    assert [u["passes"] for u in only[1]["per_unit"]] == [[["forward"]], [["forward", "backward"]]]


@pytest.mark.parametrize("vpp", [1, pytest.param(2, marks=pytest.mark.exhaustive)])  # vpp 2: the exhaustive leg's
def test_legacy_hooks_on_every_pipeline_stage(real_tree, megatron_python: Path, tmp_path: Path, vpp: int) -> None:
    root = real_tree("0.7.1")
    code, out = cli_json(
        "apply", "--verl-root", root, "--backend", "megatron", "--only", "verl.legacy-megatron-workers"
    )
    assert code == ExitCode.OK, out
    micro_batches = 4 if vpp > 1 else 3
    driver = [str(RUNTIME / "legacy_driver.py"), "megatron", "--patched-file", str(root / LEGACY_TARGET)]
    driver += ["--pp", "2", "--vpp", str(vpp), "--micro-batches", str(micro_batches)]
    off = run_ranks(megatron_python, driver, tmp_path, "off")
    on = run_ranks(megatron_python, driver, tmp_path, "on", **msprobe_config(tmp_path, "on"))
    for rank in (0, 1):
        assert on[rank]["param_checksum"] == off[rank]["param_checksum"]  # the update is the same
        assert not on[rank]["open_step"]
    check_stages(on, vpp=vpp, micro_batches=micro_batches)


def _generate_side(actor: Path, gen: Path, request_ids: list[str]) -> None:
    """A stand-in generate side in the vLLM-Ascend DispatchLogger layout: one single-request prefill
    line per id (with vLLM's `-<8 hex>` suffix) and, as its dump, a copy of a real dump.json of the
    actor run (only the pairing is under test here, not the numbers)."""
    pid = gen / "4321"
    source = next(actor.glob("step0/rank0/dump.json"))
    lines = []
    for step, rid in enumerate(request_ids):
        (pid / f"step{step}" / "rank0").mkdir(parents=True)
        shutil.copy(source, pid / f"step{step}" / "rank0" / "dump.json")
        request = {"request_id": f"{rid}-1a2b3c4d", "type": "new", "tokens": 8}
        lines.append({"source": "dispatch_logger", "pid": 4321, "rank": 0, "step": step, "phase": "prefill",
                      "requests": [request]})  # fmt: skip
    (pid / "dispatch_log.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


@pytest.mark.parametrize("vpp", [1, 2])
def test_check_dump_pairs_the_forward_step_of_split_micro_batches(
    megatron_python: Path, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, vpp: int
) -> None:
    """check-dump on the dumps of a real PP=2 (xVPP=2) run whose stage 0 splits micro-batches into a
    forward step and a backward step (1F1B): each prefill pairs with the step that ran the forward of
    its micro-batch on every stage and chunk, never with a backward-only step. The actor side is the
    run's own dump (verl 0.9.1's patched engine hooks, V1-shaped micro-batches of one sample, sample
    1 a padding sample): the session's shared run (`shared_engine_run`), copied, since this test deletes a
    step and rewrites a log. The generate side is a stand-in (`_generate_side`)."""
    folder, on = shared_engine_run(tmp_path_factory, megatron_python, vpp)
    micro_batches = micro_batches_for(vpp)
    actor = tmp_path / "dump-pairs"
    shutil.copytree(folder / "dump-on", actor)
    lines = {(line["rank"], line["step"]): line for result in on for line in result["update_actor_log"]["lines"]}
    # Request ids from V1 micro-batches on every stage and chunk: each step's line names its
    # micro-batch's one real sample, none for the padding sample (micro-batch 1).
    for line in lines.values():
        call = 0 if line["phase"] == "log_prob" else 1
        expected = [] if line["micro_batch"] == 1 else [f"v1-{call}-{line['micro_batch']}"]
        assert line["request_ids"] == expected, line
    assert {line["pp_rank"] for line in lines.values()} == {0, 1}
    # the update call's real samples (sample 1 is padding) and one of the log-prob call's
    update_ids = [f"v1-1-{i}" for i in range(micro_batches) if i != 1]
    _generate_side(actor, tmp_path / "generate", ["v1-0-0", *update_ids])
    split = [key for key, line in lines.items() if line["passes"] == ["backward"] and line["request_ids"]]
    # model chunks before the last one (stage 0; with VPP also stage 1's first chunk) split a micro-batch:
    # a backward-only step that carries its request id
    assert split and not [key for key in split if key[0] == 1 and lines[key]["vp_stage"] in (None, vpp - 1)]

    code, out = cli_json("check-dump", "--actor", actor, "--generate", tmp_path / "generate")
    assert code == ExitCode.OK, out["problems"]
    assert out["unpaired"] == []
    assert any("hold only the backward" in note for note in out["notes"])
    chunks = range(vpp) if vpp > 1 else [None]
    for rid in ["v1-0-0", *update_ids]:
        mine = [p for p in out["pairs"] if p["request_id"] == rid]
        # one pair per stage and model chunk, each with the step that ran the forward there
        assert sorted((p["pp_rank"], repr(p["vp_stage"])) for p in mine) == sorted(
            (stage, repr(chunk)) for stage in (0, 1) for chunk in chunks
        ), (rid, mine)
        for pair in mine:
            line = lines[(pair["actor"]["rank"], pair["actor"]["step"])]
            assert line["request_ids"] == [rid] and "forward" in line["passes"] and pair["passes"] == line["passes"]
            assert pair["phase"] == ("log_prob" if rid.startswith("v1-0-") else "update_actor")
            assert pair["actor"]["dump"] == str(actor / f"step{line['step']}" / f"rank{line['rank']}" / "dump.json")

    # The forward step of a split micro-batch not dumped (its log line and dump gone, as when
    # msprobe's step list leaves it out): the backward-only step does not stand in for it.
    rank, step = split[0]
    rid = lines[(rank, step)]["request_ids"][0]
    forward = next(
        key
        for key, line in lines.items()
        if key[0] == rank and line["request_ids"] == [rid] and line["passes"] == ["forward"]
        and line["vp_stage"] == lines[(rank, step)]["vp_stage"]
    )  # fmt: skip
    shutil.rmtree(actor / f"step{forward[1]}" / f"rank{rank}")
    code, out = cli_json("check-dump", "--actor", actor, "--generate", tmp_path / "generate")
    assert code == ExitCode.VERIFY_FAILED  # the logged forward step has no dump.json
    assert any(f"logged step {forward[1]} rank {rank} has no" in p for p in out["problems"])
    assert [u["request_id"] for u in out["unpaired"]] == [rid]
    assert f"step {step} holds only the backward of update_actor micro-batch" in out["unpaired"][0]["reason"]
    assert f"its forward step {forward[1]} has no dump.json" in out["unpaired"][0]["reason"]
    assert not any(p["actor"]["step"] == step and p["actor"]["rank"] == rank for p in out["pairs"])
    for log in actor.glob("*/update_actor_log.jsonl"):
        kept = [ln for ln in log.read_text().splitlines() if json.loads(ln)["rank"] != rank
                or json.loads(ln)["step"] != forward[1]]  # fmt: skip
        log.write_text("".join(ln + "\n" for ln in kept))
    code, out = cli_json("check-dump", "--actor", actor, "--generate", tmp_path / "generate")
    assert code == ExitCode.OK, out["problems"]
    assert "no log line names its forward step" in out["unpaired"][0]["reason"]
