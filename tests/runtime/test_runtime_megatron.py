"""The inserted Megatron hooks, executed through megatron-core's own pipeline schedule on CPU.

What is real: the hook code exactly as `rlprobe-patch apply` wrote it into a real verl
release's `megatron/transformer_impl.py` (the driver parses that file and executes the
inserted methods and statements, it never imports verl), megatron-core 0.16.1's
`get_forward_backward_func()` schedule with PP=1 on a one-process gloo group (it runs the
forward, the loss and the backward itself), torch autograd, and msprobe writing its dumps.
What is a stand-in: the engine around the hooks (verl's Megatron engine needs GPU-only
megatron pieces) and the model (a two-layer MLP). See `tests/runtime/megatron_driver.py`.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import TESTS, cli_json

from rlprobe_patch.base.errors import ExitCode
from runtime import venvs

DRIVER = TESTS / "runtime" / "megatron_driver.py"
TARGET = "verl/workers/engine/megatron/transformer_impl.py"


def run_driver(python: Path, patched: Path, tmp: Path, name: str, *extra: str, **env: str) -> dict:
    out = tmp / f"{name}.json"
    clean = {k: v for k, v in os.environ.items() if k not in ("DUMP_ON", "DUMP_PHASE", "MSPROBE_ACTOR_CONFIG")}
    proc = subprocess.run(
        [str(python), str(DRIVER), "--patched-file", str(patched), "--micro-batches", "3", "--out", str(out), *extra],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=600,
    )
    result = json.loads(out.read_text())
    assert proc.returncode == 0 and result["ok"], (result.get("error"), proc.stderr[-2000:])
    return result


@pytest.fixture(scope="module")
def megatron_python() -> Path:
    return venvs.ensure_megatron_venv()


@pytest.mark.parametrize("version", ["0.6.0", "0.8.0", "0.9.1"])
def test_megatron_hooks_dump_the_requested_phase(
    real_tree, megatron_python: Path, tmp_path: Path, version: str
) -> None:
    """Each run makes a log-prob call, then an update call (`--phase-run both`), and the driver tells the calls
    apart (`per_call`): one run without dumping, then one per requested phase, where that phase's call dumps
    and the other phase's call, before or after it in the same process, does not."""
    root = real_tree(version)
    code, out = cli_json("apply", "--verl-root", root, "--backend", "megatron", "--worker-impl", "engine")
    assert code == ExitCode.OK, out
    patched = root / TARGET
    both = ("--phase-run", "both", "--calls", "2")
    phases = ("log_prob", "update_actor")

    off = run_driver(megatron_python, patched, tmp_path, "off", *both)
    for call in range(len(phases)):
        quiet = off["per_call"][call]
        assert not quiet["checks"]["dumped"]
        assert [mb["mb"] for mb in quiet["per_micro_batch"]] == [0, 1, 2]
        assert not any(mb["started"] for mb in quiet["per_micro_batch"])

    for call, phase in enumerate(phases):
        forward_only = phase == "log_prob"
        dump = tmp_path / f"dump-{phase}"
        config = tmp_path / f"config-{phase}.json"
        config.write_text(
            json.dumps(
                {
                    "task": "statistics",
                    "dump_path": str(dump),
                    "rank": [],
                    "step": [],
                    "level": "mix",
                    "async_dump": False,
                }
            )
        )
        env = {"DUMP_ON": "1", "MSPROBE_ACTOR_CONFIG": str(config)}
        if phase != "log_prob":
            env["DUMP_PHASE"] = phase
        on = run_driver(megatron_python, patched, tmp_path, f"on-{phase}", *both, **env)
        mine = on["per_call"][call]
        checks = mine["checks"]
        assert on["losses"] == off["losses"]  # dumping does not change the numbers
        for name in (
            "dumped",
            "all_started",
            "all_finished",
            "all_finished_before_next",
            "dump_json_per_step",
            "log_line_per_step",  # the whole run's log lines: those of this call's steps, no others
            "log_ids_match",
            "steps_distinct",
        ):
            assert checks[name], (name, mine["per_micro_batch"])
        assert [mb["mb"] for mb in mine["per_micro_batch"]] == [0, 1, 2]
        assert [s["step"] for s in on["dump"]["steps"]] == [0, 1, 2]  # the whole run's dump
        if forward_only:
            assert checks["all_finished_after_loss"]
            assert all(s["backward_keys"] == 0 for s in on["dump"]["steps"])
        else:
            # The step closes only after the whole backward of its micro-batch has run.
            assert checks["all_finished_after_backward"] and checks["all_finished_within_backward_step"]
            assert checks["dump_has_backward_records"]
            order = mine["per_micro_batch"][0]["order"]
            assert order.index("model.backward_end") < order.index("hook._finish_dump_step")

        # The other phase's call does not dump.
        quiet = on["per_call"][1 - call]
        assert not quiet["checks"]["dumped"]
        assert not any(mb["started"] for mb in quiet["per_micro_batch"])


def test_megatron_per_token_loss_return(real_tree, megatron_python: Path, tmp_path: Path) -> None:
    """verl >= 0.9 returns (local_sum, num_tokens, output) in Megatron's per-token regime."""
    root = real_tree("0.9.1")
    assert cli_json("apply", "--verl-root", root, "--backend", "megatron", "--worker-impl", "engine")[0] == ExitCode.OK
    dump = tmp_path / "dump"
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"task": "statistics", "dump_path": str(dump), "level": "mix"}))
    on = run_driver(
        megatron_python,
        root / TARGET,
        tmp_path,
        "per-token",
        "--phase-run",
        "update_actor",
        "--per-token-loss",
        DUMP_ON="1",
        DUMP_PHASE="all",
        MSPROBE_ACTOR_CONFIG=str(config),
    )
    assert on["checks"]["all_finished_after_backward"] and on["checks"]["log_line_per_step"]


# The request ids in the log lines, per micro-batch (3 micro-batches of 2 samples), for a call on a
# V1-shaped batch (megatron_driver.make_v1_batch): samples 1 and 4 are padding samples carrying a
# deep copy of sample 0's fields, so "v1-<call>-0" must appear once and nothing of theirs.
def v1_ids(call: int) -> list[list[str]]:
    return [[f"v1-{call}-0"], [f"v1-{call}-2", f"v1-{call}-3"], [f"v1-{call}-5"]]


@pytest.mark.parametrize("version", ["0.8.0", "0.9.1"])
def test_megatron_request_ids_from_v1_and_v0_batches(
    real_tree, megatron_python: Path, tmp_path: Path, version: str
) -> None:
    """verl 0.9's V1 trainer hands the engine micro-batches whose request ids are only in each
    sample's `extra_fields`, with `_balance_batch`'s padding samples (uid "pad...") among them; V0
    puts `request_id` at the top level. The Megatron engine hook logs, per micro-batch, exactly the
    real samples' ids in both cases. Stand-ins: see megatron_driver.make_v1_batch."""
    root = real_tree(version)
    assert cli_json("apply", "--verl-root", root, "--backend", "megatron", "--worker-impl", "engine")[0] == ExitCode.OK
    config = tmp_path / "config.json"
    for shape in ("v1", "v0"):
        dump = tmp_path / f"dump-{shape}"
        config.write_text(json.dumps({"task": "statistics", "dump_path": str(dump), "level": "mix"}))
        extra = ["--phase-run", "both", "--calls", "2", *(["--v1-batch"] if shape == "v1" else [])]
        on = run_driver(
            megatron_python,
            root / TARGET,
            tmp_path,
            f"ids-{shape}",
            *extra,
            DUMP_ON="1",
            DUMP_PHASE="all",
            MSPROBE_ACTOR_CONFIG=str(config),
        )
        lines = on["update_actor_log"]["lines"]
        assert [line["phase"] for line in lines] == ["log_prob"] * 3 + ["update_actor"] * 3
        assert [line["step"] for line in lines] == list(range(6))  # one line per micro-batch, per call
        if shape == "v1":
            expected = v1_ids(0) + v1_ids(1)
        else:
            expected = [[f"req-{call}-{2 * mb}", f"req-{call}-{2 * mb + 1}"] for call in (0, 1) for mb in range(3)]
        assert [line["request_ids"] for line in lines] == expected
        assert [line["num_requests"] for line in lines] == [len(ids) for ids in expected]
        assert on["checks"]["log_line_per_step"] and on["checks"]["dump_json_per_step"]
