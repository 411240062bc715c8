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
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from conftest import cli_json
from runtime import venvs

from rlprobe_patch.errors import ExitCode

pytestmark = [pytest.mark.runtime, pytest.mark.real]

RUNTIME = Path(__file__).parent / "runtime"
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


@pytest.mark.parametrize(("version", "vpp"), [("0.8.0", 1), ("0.9.1", 1), ("0.9.1", 2)])
def test_engine_hooks_on_every_pipeline_stage(
    real_tree, megatron_python: Path, tmp_path: Path, version: str, vpp: int
) -> None:
    root = real_tree(version)
    code, out = cli_json("apply", "--verl-root", root, "--backend", "megatron", "--worker-impl", "engine")
    assert code == ExitCode.OK, out
    micro_batches = 4 if vpp > 1 else 3  # the interleaved schedule needs a multiple of PP
    driver = [str(RUNTIME / "megatron_driver.py"), "--patched-file", str(root / ENGINE_TARGET)]
    driver += ["--pp", "2", "--vpp", str(vpp), "--phase-run", "both", "--calls", "2"]
    driver += ["--micro-batches", str(micro_batches)]
    off = run_ranks(megatron_python, driver, tmp_path, "off")
    on = run_ranks(megatron_python, driver, tmp_path, "on", **msprobe_config(tmp_path, "on"))
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


@pytest.mark.parametrize("vpp", [1, 2])
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
