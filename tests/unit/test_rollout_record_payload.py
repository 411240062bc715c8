"""`vllm.rollout-record`'s inserted code, run here on stand-ins for vLLM's scheduler and request.

What the payload writes is read by `report.rollout_record.read_records`, the one definition of the
format; the switches are read by the shared reader (`MISMATCH_ON`, `MISMATCH_DIR`, which must be
absolute); off, the request is not touched and nothing is imported or written; a failure to write
never reaches the engine. The same code in the real engine: tests/runtime/test_runtime_vllm.py.
"""

from __future__ import annotations

import os
import socket
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from rlprobe_patch.catalogue.patches import load_catalogue, patches_dir
from rlprobe_patch.codemod import Payload
from rlprobe_patch.report.rollout_record import read_records, record_files

PATCH = patches_dir() / "vllm.rollout-record"
SHARED = patches_dir() / "_shared" / "switches.py"


class Reason:
    """vLLM's FinishReason: an enum whose str() is the OpenAI spelling."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return self.text


class Dtype:
    """torch.dtype's str(): `torch.bfloat16`."""

    def __str__(self) -> str:
        return "torch.bfloat16"


class Untouchable:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"touched ({name}) with the record off")


def sampling(**changes: Any) -> Any:
    params = dict(
        temperature=0.7,
        top_p=0.8,
        top_k=0,
        min_p=0.0,
        seed=None,
        max_tokens=3,
        min_tokens=0,
        logprobs=0,
        presence_penalty=0.0,
        frequency_penalty=0.0,
        repetition_penalty=1.0,
        logits_processors=[object()],  # not a scalar: left out
    )
    return types.SimpleNamespace(**{**params, **changes})


def request(rid: str, prompt: list[int] | None, output: list[int], params: Any = None, reason: str = "length") -> Any:
    return types.SimpleNamespace(
        request_id=rid,
        prompt_token_ids=prompt,
        output_token_ids=tuple(output),  # a ConstantList in vLLM
        sampling_params=sampling() if params is None else params,
        get_finished_reason=lambda: Reason(reason),
    )


def scheduler(**model: Any) -> Any:
    config = {"dtype": Dtype(), "logprobs_mode": "processed_logprobs", "model": "/models/smol", **model}
    config = {k: v for k, v in config.items() if v is not None}
    return types.SimpleNamespace(vllm_config=types.SimpleNamespace(model_config=types.SimpleNamespace(**config)))


@pytest.fixture
def record(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The inserted hook, `record(scheduler, request)`, as the codemod inserts it (shared parts spliced),
    in a process whose `vllm.version` is a stand-in."""
    monkeypatch.delitem(sys.modules, "_rlprobe_patch_capture", raising=False)
    for name in ("MISMATCH_ON", "MISMATCH_DIR", "PROMPTS_ONLY"):
        monkeypatch.delenv(name, raising=False)
    version = types.ModuleType("vllm.version")
    version.__version__ = "0.32.0+cpu"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, "vllm.version", version)
    namespace: dict[str, Any] = {}
    payload = PATCH / "payload.py"
    code = Payload(payload).module.code.replace("from _shared.switches import Switches\n", "")
    exec(compile(code, str(payload), "exec"), namespace)
    return lambda sched, req: namespace["record_finished_request"](sched, req)


def test_the_payload_takes_the_shared_capture_reader() -> None:
    (patch,) = [p for p in load_catalogue() if p.id == "vllm.rollout-record"]
    payload = Payload(patch.folder / "payload.py")
    assert payload.sources[1:] == (SHARED,)
    code = payload.module.code
    assert "os.environ" not in code.split("class _RlprobeRolloutRecord", 1)[1].split("def _rlprobe_on_rank")[0]
    assert f"{patch.id} r{patch.revision}:" in code


def test_each_finished_request_is_one_line_read_records_reads(
    record: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MISMATCH_ON", "1")
    monkeypatch.setenv("MISMATCH_DIR", str(tmp_path / "caps"))
    sched = scheduler()
    record(sched, request("a-0123abcd", [1, 2, 3], [7, 8, 9]))
    record(sched, request("b-89abcdef", [4], [5], reason="stop"))
    (path,) = record_files([tmp_path / "caps"])
    assert path == tmp_path / "caps" / "rollout" / f"{socket.gethostname()}-{os.getpid()}.rlprobe-rollout.jsonl"
    first, second = read_records(path)
    assert (first.request_id, first.sent_id, first.prompt_ids, first.output_ids) == (
        "a-0123abcd",
        "a",
        (1, 2, 3),
        (7, 8, 9),
    )
    assert (first.engine, first.engine_version, first.finish_reason) == ("vllm", "0.32.0+cpu", "length")
    assert (first.dtype, first.logprobs_mode, first.model) == ("bfloat16", "processed_logprobs", "/models/smol")
    assert first.sampling == {
        "temperature": 0.7,
        "top_p": 0.8,
        "top_k": 0,
        "min_p": 0.0,
        "seed": None,
        "max_tokens": 3,
        "min_tokens": 0,
        "logprobs": 0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "repetition_penalty": 1.0,
    }
    assert (second.sent_id, second.finish_reason) == ("b", "stop")
    err = capsys.readouterr().err
    assert err.count("rlprobe-patch: vllm.rollout-record r1: each finished request recorded in") == 1, err


def test_a_release_without_logprobs_mode_records_null_and_an_enum_its_value(
    record: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MISMATCH_ON", "yes")
    monkeypatch.setenv("MISMATCH_DIR", str(tmp_path))
    record(scheduler(logprobs_mode=None), request("old", [1], [2]))  # vLLM 0.8.5 to 0.9.2 have none
    record(scheduler(logprobs_mode=types.SimpleNamespace(value="raw_logprobs")), request("enum", [1], [2]))
    (path,) = record_files([tmp_path])
    assert [r.logprobs_mode for r in read_records(path)] == [None, "raw_logprobs"]


def test_requests_without_token_prompt_or_sampling_are_not_recorded(
    record: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MISMATCH_ON", "1")
    monkeypatch.setenv("MISMATCH_DIR", str(tmp_path))
    record(scheduler(), request("embeds", None, [2]))  # prompt embeddings
    pooling = request("pool", [1], [])
    pooling.sampling_params = None
    record(scheduler(), pooling)
    assert record_files([tmp_path]) == []


@pytest.mark.parametrize("directory", [None, "caps", "~/caps"])
def test_a_relative_mismatch_dir_writes_nothing_and_says_so_once(
    record: Any,
    directory: str | None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The engine's working directory is not the trainer's: a relative folder would scatter records."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MISMATCH_ON", "1")
    if directory is not None:
        monkeypatch.setenv("MISMATCH_DIR", directory)
    record(scheduler(), request("a", [1], [2]))
    record(scheduler(), request("b", [1], [2]))
    assert list(tmp_path.iterdir()) == []
    err = capsys.readouterr().err
    shown = directory or "rlprobe-logprobs"
    assert err.count(f"MISMATCH_ON with MISMATCH_DIR {shown}, not an absolute path") == 1, err
    assert "export MISMATCH_DIR as an absolute path" in err


def test_off_touches_nothing_and_imports_nothing(record: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MISMATCH_DIR", str(tmp_path))  # without MISMATCH_ON: off
    record(Untouchable(), Untouchable())  # the first call reads the switches
    before = set(sys.modules)
    for _ in range(3):
        record(Untouchable(), Untouchable())
    assert set(sys.modules) == before
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_never_stops_the_engine_and_is_said_once(
    record: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "caps"
    blocker.write_text("a file where the folder should be")
    monkeypatch.setenv("MISMATCH_ON", "1")
    monkeypatch.setenv("MISMATCH_DIR", str(blocker))
    record(scheduler(), request("a", [1], [2]))
    record(scheduler(), request("b", [1], [2]))
    err = capsys.readouterr().err
    assert err.count("rlprobe-patch: vllm.rollout-record r1: no record of request a (") == 1, err
    assert "no record of request b" not in err and "the engine goes on" in err
    blocker.unlink()  # the next request is tried again
    record(scheduler(), request("c", [1], [2]))
    (path,) = record_files([blocker])
    assert [r.request_id for r in read_records(path)] == ["c"]


def test_a_wrong_switch_value_names_the_variable(record: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MISMATCH_ON", "sometimes")
    with pytest.raises(ValueError, match=r"MISMATCH_ON='sometimes'.* is not a switch value"):
        record(scheduler(), request("a", [1], [2]))
