"""sglang.dispatch-logger at run time, and check-dump pairing its passes with actor steps.

Real: `ModelRunner.forward` exactly as it stands in real SGLang files patched by
`rlprobe-patch apply --mode consistency` (SGLang's own debugger start/stop from 0.5.11,
sglang.model-runner's below), the added `dispatch_logger.py`, msprobe 26.2.0 writing the dumps,
CPU torch; on the actor side (check-dump), verl 0.9.1's real `FSDPEngineWithLMHead` patched
with verl.fsdp-engine, as in test_workflow_check_dump.py. Stand-in: the ModelRunner object and
the ForwardBatch objects (see tests/runtime/sglang_forward_driver.py): SGLang's import chain
needs triton and CUDA kernels.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import SGLANG_MEMBERS, TESTS, cli_json, package_wheel, unpack
from packaging.version import Version

from rlprobe_patch.base.errors import ExitCode
from runtime import venvs
from runtime.shared_runs import fsdp_actor_dump

DRIVER = TESTS / "runtime" / "sglang_forward_driver.py"
ENV_KEYS = ("MSPROBE_SGLANG_CONFIG", "MSPROBE_SGLANG_PREFILL_CONFIG", "MSPROBE_SGLANG_DECODE_CONFIG")
NATIVE = ("0.5.11", "0.5.23")
PHASES = ["prefill", "prefill", "decode", "prefill", "prefill", "prefill", "prefill"]
MODES = ["extend", "extend", "decode", "extend", "extend", "extend", "extend"]  # the idle pass: no line


@contextlib.contextmanager
def state_home(path: Path) -> Iterator[None]:
    """A module-scoped fixture's own registry (the autouse one is per test)."""
    old = os.environ.get("RLPROBE_PATCH_STATE_HOME")
    os.environ["RLPROBE_PATCH_STATE_HOME"] = str(path)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("RLPROBE_PATCH_STATE_HOME", None)
        else:
            os.environ["RLPROBE_PATCH_STATE_HOME"] = old


@pytest.fixture(scope="module")
def python() -> Path:
    return venvs.ensure_runtime_venv("0.9.1")  # torch 2.13 CPU + mindstudio-probe 26.2.0


@pytest.fixture(scope="module")
def patched(tmp_path_factory: pytest.TempPathFactory):
    """A real SGLang tree per release, patched with --mode consistency (once per module)."""
    trees: dict[str, Path] = {}

    def make(version: str) -> Path:
        if version not in trees:
            root = unpack(
                package_wheel("sglang", version), tmp_path_factory.mktemp(f"sglang-{version}"), SGLANG_MEMBERS
            )
            with state_home(tmp_path_factory.mktemp("state")):
                code, out = cli_json("apply", "--sglang-root", root, "--mode", "consistency")
            assert code == ExitCode.OK, out
            trees[version] = root
        return trees[version]

    return make


def config(tmp: Path, name: str) -> tuple[Path, Path]:
    dump = tmp / f"dump-{name}"
    path = tmp / f"{name}.json"
    path.write_text(json.dumps({"task": "statistics", "dump_path": str(dump), "level": "mix"}))
    return path, dump


def drive(python: Path, root: Path, tmp: Path, version: str, cfg: Path | None, *args: str, **env: str) -> dict:
    """The real patched forward over the driver's eight passes; the debugger from `cfg` if given."""
    out = tmp / "result.json"
    folder = root / "sglang/srt/model_executor"
    command = [str(python), str(DRIVER), "--patched-file", str(folder / "model_runner.py")]
    command += ["--logger-file", str(folder / "dispatch_logger.py"), *args, "--out", str(out)]
    clean = {k: v for k, v in os.environ.items() if k not in ENV_KEYS}
    if cfg is not None and version in NATIVE:
        command += ["--config", str(cfg)]  # SGLang's --msprobe-dump-config
    elif cfg is not None:
        clean["MSPROBE_SGLANG_CONFIG"] = str(cfg)  # sglang.model-runner's debugger
    proc = subprocess.run(command, env={**clean, **env}, cwd=tmp, capture_output=True, text=True, timeout=300)
    result = json.loads(out.read_text())
    assert proc.returncode == 0 and result["ok"], result.get("error", proc.stderr[-2000:])
    return result


def log_lines(dump: Path) -> list[dict]:
    (log,) = dump.glob("*/dispatch_log.jsonl")
    assert log.parent.name.isdigit()  # {dump_path}/{pid}/dispatch_log.jsonl
    return [json.loads(line) for line in log.read_text().splitlines()]


def via_scheduler(root: Path, version: str) -> list[str]:
    """SGLang before 0.5.8: the batches' rids come through the statements inserted into the
    scheduler and ForwardBatch.init_new (their ForwardBatch and ModelWorkerBatch have none)."""
    if Version(version) >= Version("0.5.8"):
        return []
    files = {
        "--scheduler-file": "managers/scheduler.py",
        "--forward-batch-file": "model_executor/forward_batch_info.py",
    }
    return [arg for option, file in files.items() for arg in (option, str(root / "sglang/srt" / file))]


@pytest.mark.parametrize("version", ["0.4.6.post5", "0.5.3", "0.5.10.post1", "0.5.11", "0.5.23"])
def test_one_line_per_dumped_forward(python: Path, patched, tmp_path: Path, version: str) -> None:
    root = patched(version)
    old = via_scheduler(root, version)
    off = drive(python, root, tmp_path, version, None, *old)
    assert off["debugger"] is False
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]  # no debugger: nothing written
    if old:  # the two inserted statements, as written in the patched files
        worker = "batch_or_worker_batch" if version == "0.5.3" else "model_worker_batch"
        assert off["rids_statements"] == [
            f"{worker}.rids = [req.rid for req in batch.reqs]",
            "ret.rids = getattr(batch, 'rids', None)",
        ]

    cfg, dump = config(tmp_path, "on")
    on = drive(python, root, tmp_path, version, cfg, *old)
    assert on["debugger"] and on["outputs"] == off["outputs"]  # the forward's results are untouched
    steps = sorted(int(p.name[4:]) for p in dump.glob("step*") if (p / next(p.iterdir()).name / "dump.json").is_file())
    assert steps == list(range(8))  # msprobe: one step per forward pass, the idle one included
    lines = log_lines(dump)
    assert [line["step"] for line in lines] == [0, 1, 2, 3, 5, 6, 7]  # the idle pass (step 4) is not logged
    assert [line["mode"] for line in lines] == MODES
    assert [line["phase"] for line in lines] == PHASES
    for line in lines:
        assert (dump / line["dump"]).is_file(), line  # the line names msprobe's own dump of its step
        assert line["source"] == "sglang" and line["pd_role"] == "null" and line["tp_rank"] == 0
    rids = [line["rids"] for line in lines]
    assert rids == [["rid-a"], ["rid-b"], ["rid-a", "rid-b"], ["rid-c", "rid-d"], ["rid-e"], ["rid-f"], ["rid-f"]]
    assert [line["extend_lens"] for line in lines] == [[4], [5], None, [3, 6], [3], [2], [3]]
    assert [line["prefix_lens"] for line in lines] == [[0], [0], None, [0, 0], [2], [0], [2]]
    assert lines[2]["seq_lens"] == [5, 6]


@pytest.mark.parametrize("version", ["0.5.10.post1", "0.5.11"])
def test_data_parallel_rank_names_the_dump(python: Path, patched, tmp_path: Path, version: str) -> None:
    """DP > 1: the debugger dumps under rank<gpu_id>, and the log line says so."""
    cfg, dump = config(tmp_path, "dp")
    drive(python, patched(version), tmp_path, version, cfg, "--dp-size", "2", "--gpu-id", "3")
    lines = log_lines(dump)
    assert {line["rank"] for line in lines} == {3} and lines[0]["gpu_id"] == 3
    assert lines[0]["dump"] == "step0/rank3/dump.json" and (dump / "step0/rank3/dump.json").is_file()


def test_pd_role_is_logged(python: Path, patched, tmp_path: Path) -> None:
    cfg, dump = config(tmp_path, "prefill")
    drive(python, patched("0.5.11"), tmp_path, "0.5.11", cfg, "--disaggregation-mode", "prefill")
    assert {line["pd_role"] for line in log_lines(dump)} == {"prefill"}


# -- check-dump on these dumps and the real FSDP actor's ------------------------------------------
@pytest.fixture(scope="module")
def actor_dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """verl 0.9.1's real FSDP engine patched with verl.fsdp-engine: two micro-batches, req-0 and req-1 (the session's
    run, test_workflow_check_dump.py's actor side too)."""
    return fsdp_actor_dump(tmp_path_factory)


RIDS = "req-0,req-1,req-2,req-3,req-4,req-5"


def test_check_dump_pairs_sglang_prefills_with_actor_steps(
    python: Path, patched, actor_dump: Path, tmp_path: Path
) -> None:
    cfg, generate = config(tmp_path, "generate")
    drive(python, patched("0.5.23"), tmp_path, "0.5.23", cfg, "--rids", RIDS)
    code, out = cli_json("check-dump", "--actor", actor_dump, "--generate", generate)
    assert code == ExitCode.OK, out["problems"]
    pairs = {p["request_id"]: (p["generate"]["dump"], p["actor"]["dump"]) for p in out["pairs"]}
    pid = next(p.name for p in generate.iterdir() if p.name.isdigit())
    assert pairs == {
        "req-0": (str(generate / f"step0/proc{pid}/dump.json"), str(actor_dump / "step0/rank0/dump.json")),
        "req-1": (str(generate / f"step1/proc{pid}/dump.json"), str(actor_dump / "step1/rank0/dump.json")),
    }
    reasons = {(u["request_id"], u["reason"].split(" (")[0].split(":")[0]) for u in out["unpaired"]}
    assert reasons == {
        ("req-2", "batched prefill of 2 requests in one pass"),
        ("req-3", "batched prefill of 2 requests in one pass"),
        ("req-4", "the pass reused 2 cached prefix token(s)"),
        ("req-5", "prefilled in 2 chunks"),
        ("req-5", "the pass reused 2 cached prefix token(s)"),
    }

    # --compare: msprobe's own compare on each pair, as for vLLM-Ascend.
    code, out = cli_json(
        "check-dump", "--actor", actor_dump, "--generate", generate, "--compare", "--compare-output",
        tmp_path / "cmp", "--python", python,
    )  # fmt: skip
    # The two sides are different models (the actor's and this stand-in's), so msprobe's own verdict is
    # that each pair disagrees, and a disagreement exits 4.
    assert len(out["pairs"]) == 2 and all(p["compare"]["ok"] and p["compare"]["files"] for p in out["pairs"])
    assert code == ExitCode.VERIFY_FAILED, out["problems"]
    assert [p["compare"]["agree"] for p in out["pairs"]] == [False, False]
    assert sorted(p.split(" (")[0] for p in out["problems"]) == ["msprobe: req-0 DISAGREES", "msprobe: req-1 DISAGREES"]


def test_check_dump_lists_what_cannot_pair(python: Path, patched, actor_dump: Path, tmp_path: Path) -> None:
    # Passes whose batch carried no rids (speculative decoding before 0.5.8, where the scheduler site
    # is not on the path): nothing pairs, and check-dump says why.
    cfg, generate = config(tmp_path, "old")
    drive(python, patched("0.4.6.post5"), tmp_path, "0.4.6.post5", cfg, "--no-rids")
    code, out = cli_json("check-dump", "--actor", actor_dump, "--generate", generate)
    assert code == ExitCode.VERIFY_FAILED and out["pairs"] == []
    assert any("no rids in the log line (the pass's batch carried no request ids" in p for p in out["problems"])
    assert len(out["unpaired"]) == 6  # every extend pass (the decode pass is not a prefill)

    # PD: the decode server's log is never paired; a dump removed after the run is named.
    cfg, decode = config(tmp_path, "decode")
    drive(python, patched("0.5.11"), tmp_path, "0.5.11", cfg, "--rids", RIDS, "--disaggregation-mode", "decode")
    code, out = cli_json("check-dump", "--actor", actor_dump, "--generate", decode)
    assert code == ExitCode.VERIFY_FAILED and out["pairs"] == [] and out["unpaired"] == []
    cfg, generate = config(tmp_path, "gone")
    drive(python, patched("0.5.11"), tmp_path, "0.5.11", cfg, "--rids", RIDS)
    shutil.rmtree(next(generate.glob("step0")))
    code, out = cli_json("check-dump", "--actor", actor_dump, "--generate", generate)
    assert code == ExitCode.VERIFY_FAILED
    assert any("prefill step 0 rank None of req-0 has no step0/proc" in p for p in out["problems"])
    assert [p["request_id"] for p in out["pairs"]] == ["req-1"]


def test_check_dump_pairs_prefills_of_a_release_before_rids_reached_the_model_runner(
    python: Path, patched, actor_dump: Path, tmp_path: Path
) -> None:
    """SGLang 0.4.6.post5: the rids the scheduler site puts on the worker batch reach the log, and pair."""
    cfg, generate = config(tmp_path, "old-paired")
    root = patched("0.4.6.post5")
    drive(python, root, tmp_path, "0.4.6.post5", cfg, "--rids", RIDS, *via_scheduler(root, "0.4.6.post5"))
    code, out = cli_json("check-dump", "--actor", actor_dump, "--generate", generate)
    assert code == ExitCode.OK, out["problems"]
    assert sorted(p["request_id"] for p in out["pairs"]) == ["req-0", "req-1"]
