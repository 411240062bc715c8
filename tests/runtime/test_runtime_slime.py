"""slime's real patched `forward_only` / `train_one_step`, run under megatron-core's real schedule on CPU.

Real: slime's `model.py` as `rlprobe-patch apply` left it in a real release (imported, with its
`get_batch`, `DataIterator`, `loss_function` and log-prob code), megatron-core 0.16.1's
`forward_backward_no_pipelining` (PP=1, gloo), torch autograd, msprobe writing its dumps.
Stand-ins (`tests/runtime/slime_driver.py` says which and why): `megatron.training` (not in
megatron-core's wheel), the accelerator calls of slime's `get_batch` and of megatron-core's
schedule, the model (a toy causal LM) and the optimizer (SGD).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import TESTS, cli_json
from script_oracle import SHARED

from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.catalogue import wheels
from runtime import venvs

pytestmark = pytest.mark.skipif(
    not (SHARED / "upstream" / "slime").is_dir(), reason="../shared/upstream/slime is missing"
)

DRIVER = TESTS / "runtime" / "slime_driver.py"
SWITCHES = ("DUMP_ON", "DUMP_PHASE", "PROMPTS_ONLY", "MSPROBE_ACTOR_CONFIG", "TORCHDYNAMO_DISABLE")


@pytest.fixture(scope="module")
def megatron_python() -> Path:
    return venvs.ensure_megatron_venv()


def run_driver(python: Path, root: Path, work: Path, *extra: str, **env: str) -> dict:
    work.mkdir(parents=True)
    out = work / "result.json"
    clean = {k: v for k, v in os.environ.items() if k not in SWITCHES}
    proc = subprocess.run(
        [str(python), str(DRIVER), "--slime-root", str(root), "--out", str(out), "--workdir", str(work), *extra],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=600,
        cwd=work,
    )
    result = json.loads(out.read_text())
    assert proc.returncode == 0 and result["ok"], (result.get("error"), proc.stderr[-2000:])
    result["stderr"] = proc.stderr
    return result


def numbers(result: dict) -> tuple:
    return result["train"], result["log_probs"], result["ref_log_probs"], result["params_after"]


@pytest.mark.parametrize("version", ["0.2.2", "0.3.1"])
def test_slime_actor_dumps_one_step_per_micro_batch(
    megatron_python: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    monkeypatch.setenv("RLPROBE_UPSTREAM", str(SHARED / "upstream"))
    archive = wheels.fetch_release("slime", version)
    original = wheels.unpack_release(archive, tmp_path / "original", "slime")
    root = wheels.unpack_release(archive, tmp_path / "patched", "slime")
    code, out = cli_json("apply", "--slime-root", root)
    assert code == ExitCode.OK, out

    config = tmp_path / "config.json"
    subprocess.run(
        [str(megatron_python), str(DRIVER), "--write-config", str(config), "--dump-path", str(tmp_path / "dump")],
        check=True,
    )
    not_json = tmp_path / "not-json.json"
    not_json.write_text("{'task': 'statistics'")
    # Issue 15: a wrong switch stops the first pass at its first statement, naming the variable.
    # Tried inside the switches-off run, before its passes (the driver drops the per-process cache).
    bad = [
        ({"DUMP_ON": "ture"}, "DUMP_ON='ture'", "is not a switch value"),
        (
            {"DUMP_ON": "1", "DUMP_PHASE": "log_prob, ref_foward", "MSPROBE_ACTOR_CONFIG": str(config)},
            "DUMP_PHASE='log_prob, ref_foward'",
            "ref_foward is not a pass of slime: use a comma-separated list of log_prob, update_actor, all, "
            "ref_forward, teacher_forward, critic_forward, update_critic",
        ),
        (
            {"DUMP_ON": "1", "MSPROBE_ACTOR_CONFIG": str(tmp_path / "missing.json")},
            "MSPROBE_ACTOR_CONFIG=",
            "no such file",
        ),
        (
            {"DUMP_ON": "on", "DUMP_PHASE": "ref_forward", "MSPROBE_ACTOR_CONFIG": str(not_json)},
            "not-json.json",
            "not JSON",
        ),
    ]
    unpatched = run_driver(megatron_python, original, tmp_path / "unpatched")
    off = run_driver(megatron_python, root, tmp_path / "off", "--bad-switches", json.dumps([env for env, *_ in bad]))
    assert off["patched"] and not unpatched["patched"]
    for (env, named, message), tried in zip(bad, off["bad_switches"], strict=True):
        assert tried["error"] and named in tried["error"] and message in tried["error"], (env, tried["error"])
        assert tried["events"] == [] and tried["offsets"] == [0], tried  # no micro-batch taken, no forward
    assert numbers(off) == numbers(unpatched)  # dumping off: the same numbers
    assert not off["msprobe_imported"] and "dump_path" not in off  # and nothing imported or written
    said = (off["stderr"] + unpatched["stderr"]).splitlines()
    assert not [line for line in said if line.startswith("rlprobe-patch:")]  # and nothing said
    # msprobe refuses TorchDynamo on torch >= 2.7, and slime's log-prob code is compiled on 0.2.x.
    on = run_driver(
        megatron_python,
        root,
        tmp_path / "on",
        DUMP_ON="yes",  # any of 1, true, yes, on (issue 15)
        DUMP_PHASE="all,ref_forward",
        MSPROBE_ACTOR_CONFIG=str(config),
        TORCHDYNAMO_DISABLE="1",
    )
    # Dumping on: the same numbers as the original file run the same way (eager: TorchDynamo off).
    eager = run_driver(megatron_python, original, tmp_path / "eager", TORCHDYNAMO_DISABLE="1")
    assert numbers(on) == numbers(eager)
    announced = [line for line in on["stderr"].splitlines() if line.startswith("rlprobe-patch:")]
    assert announced == [
        f"rlprobe-patch: slime.megatron-actor r1 hooks active (rank 0): DUMP_PHASE=all,ref_forward, "
        f"config {config}, dump path {tmp_path / 'dump'}, PROMPTS_ONLY off"
    ], on["stderr"][-2000:]
    micro_batches = on["micro_batch_indices"]
    passes = [("log_prob", "actor", None), ("ref_forward", "ref", None), ("update_actor", "actor", 7)]
    lines = on["log_lines"]
    assert len(lines) == len(passes) * len(micro_batches)
    assert on["step_dirs"] == [f"step{i}" for i in range(len(lines))]  # one msprobe step per micro-batch
    for i, line in enumerate(lines):
        phase, role, rollout_id = passes[i // len(micro_batches)]
        local = micro_batches[i % len(micro_batches)]
        assert (line["phase"], line["role"], line["rollout_id"], line["step"]) == (phase, role, rollout_id, i)
        assert line["sample_indices"] == [on["sample_indices"][j] for j in local]
        assert line["request_ids"] == [f"slime-{on['sample_indices'][j]}" for j in local]
        assert (line["rank"], line["dp_rank"], line["tp_rank"], line["pp_rank"], line["cp_rank"]) == (0, 0, 0, 0, 0)
    # Training steps close after their micro-batch's backward: every gradient accumulated, and
    # before the next micro-batch is taken.
    events = [e["event"] for e in on["events"]]
    training = events[events.index("pass_returned", events.index("pass_returned") + 1) + 1 :]
    steps = []
    for event in training:
        if event == "debugger.start":
            steps.append([])
        elif steps:
            steps[-1].append(event)
    assert len(steps) == len(micro_batches)
    for step in steps:
        assert step[:3] == ["batch_taken", "model.forward", "model.backward_begin"], step
        stop = step.index("debugger.stop")
        assert step[3:stop] == ["model.grad_accumulated"] * (stop - 3) and stop > 3, step
        assert step[stop:] in (["debugger.stop", "debugger.step"], ["debugger.stop", "debugger.step", "pass_returned"])
