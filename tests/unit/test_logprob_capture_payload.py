"""`verl.logprob-capture`'s inserted code, run here on numpy stand-ins for verl's tensors.

What the payload writes (numpy only: it cannot import rlprobe-patch in a user's tree) is read
by `report.capture_format.read_capture`, the one definition of the format; the switches are
read by the shared reader; off, the batch is not touched and TransferQueue is not called. The
V1 capture's reads run here on a stand-in `transfer_queue` module. Revision 3's pieces: the prompt
ids the forward scored (left padding removed, left-aligned; from `input_ids`, else `prompts`, else
left out) and the provenance's dtypes, each rule of `_rlprobe_training_dtype` on a stand-in config
(each release's composed config: tests/real/test_logprob_capture_real.py). The same code on verl's real
DataProto and a real TransferQueue: tests/runtime/test_logprob_capture_runtime.py.
"""

from __future__ import annotations

import json
import sys
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlprobe_patch.base.errors import RefusedError
from rlprobe_patch.catalogue.patches import patches_dir
from rlprobe_patch.codemod import Payload
from rlprobe_patch.report.capture_format import read_capture, write_capture

PAYLOAD = patches_dir() / "verl.logprob-capture" / "payload.py"


class FakeTensor:
    """What the payload calls on a torch tensor: detach, is_floating_point, float, cpu, numpy, shape."""

    def __init__(self, array: Any) -> None:
        self.array = np.asarray(array)
        self.shape = self.array.shape

    def detach(self) -> FakeTensor:
        return self

    def cpu(self) -> FakeTensor:
        return self

    def float(self) -> FakeTensor:
        return FakeTensor(self.array.astype(np.float32))

    def is_floating_point(self) -> bool:
        return bool(np.issubdtype(self.array.dtype, np.floating))

    def numpy(self) -> Any:
        return self.array


class Untouchable:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the batch was touched ({name}) with the capture off")


@pytest.fixture(scope="module")
def payload_code() -> Any:
    """The payload as the codemod inserts it (shared parts spliced), compiled once per module."""
    code = Payload(PAYLOAD).module.code.replace("from _shared.switches import Switches\n", "")
    return compile(code, str(PAYLOAD), "exec")


@pytest.fixture
def capture(monkeypatch: pytest.MonkeyPatch, payload_code: Any) -> Any:
    """The inserted class `_RlprobeLogprobCapture`, fresh for each test."""
    monkeypatch.delitem(sys.modules, "_rlprobe_patch_capture", raising=False)
    for name in ("MISMATCH_ON", "MISMATCH_DIR", "PROMPTS_ONLY"):
        monkeypatch.delenv(name, raising=False)
    namespace: dict[str, Any] = {}
    exec(payload_code, namespace)
    return namespace["_RlprobeLogprobCapture"]


def _batch(rows: int = 3, prompt: int = 4, width: int = 5, ref: bool = True) -> Any:
    rng = np.random.default_rng(0)
    lengths = np.array([5, 2, 0][:rows])
    mask = np.arange(width)[None, :] < lengths[:, None]
    attention = np.concatenate([np.arange(prompt)[None, :] >= np.array([0, 1, 3][:rows])[:, None], mask], axis=1)
    # verl pads prompts on the left; the padding positions hold ids too (any id: the mask says what counts)
    prompts = rng.integers(1, 1000, (rows, prompt))
    responses = rng.integers(0, 1000, (rows, width))
    tensors = {
        "prompts": FakeTensor(prompts),
        "input_ids": FakeTensor(np.concatenate([prompts, responses], axis=1)),
        "responses": FakeTensor(responses),
        "response_mask": FakeTensor(mask.astype(np.int64)),
        "attention_mask": FakeTensor(attention.astype(np.int64)),
        "rollout_log_probs": FakeTensor(-rng.random((rows, width)).astype(np.float32)),
        "old_log_probs": FakeTensor(-rng.random((rows, width)).astype(np.float32)),
    }
    if ref:
        tensors["ref_log_prob"] = FakeTensor(-rng.random((rows, width)).astype(np.float32))
    non_tensor = {
        "request_id": np.array([f"req-{i}" for i in range(rows - 1)] + [None], dtype=object),
        "index": np.array([7, 8, 9][:rows], dtype=object),
        "raw_prompt": np.array([[{"role": "user", "content": f"q{i}"}] for i in range(rows)] + [None], dtype=object)[
            :rows
        ],
    }
    return types.SimpleNamespace(batch=tensors, non_tensor_batch=non_tensor)


def test_what_the_payload_writes_is_a_capture_read_capture_reads(
    capture: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MISMATCH_ON", "1")
    monkeypatch.setenv("MISMATCH_DIR", str(tmp_path / "caps"))
    batch = _batch()
    # the rollout's config as verl's DictConfig answers `.get`: top_k unset, an interpolation's value as text
    rollout = {"temperature": 0.7, "top_p": 0.9, "logprobs_mode": "processed_logprobs", "n": 4}
    config = types.SimpleNamespace(actor_rollout_ref=types.SimpleNamespace(rollout=rollout))
    trainer = types.SimpleNamespace(global_steps=12, config=config)
    capture()._rlprobe_capture_logprobs(trainer, batch)

    (path,) = (tmp_path / "caps").iterdir()
    assert path.name == "step-000012.rlprobe-logprobs.npz"
    read = read_capture(path)
    assert read.step == 12 and read.request_ids == ["req-0", "req-1", ""]
    assert read.prompt_lengths.tolist() == [4, 3, 1]
    assert read.mask.sum(axis=1).tolist() == [5, 2, 0]
    assert read.dataset_index is not None and read.dataset_index.tolist() == [7, 8, 9]
    np.testing.assert_array_equal(read.responses, batch.batch["responses"].array)
    np.testing.assert_array_equal(read.rollout, batch.batch["rollout_log_probs"].array.astype(np.float64))
    np.testing.assert_array_equal(read.training, batch.batch["old_log_probs"].array.astype(np.float64))
    assert read.ref is not None
    assert read.raw_prompts is not None and read.raw_prompts[0] == '[{"role": "user", "content": "q0"}]'
    assert read.sampling == {"temperature": 0.7, "top_p": 0.9, "logprobs_mode": "processed_logprobs"}
    assert [p.name for p in (tmp_path / "caps").iterdir()] == [path.name]  # no temporary file left
    # the prompt each row's forward scored: its valid prompt tokens (left padding removed), left-aligned
    assert read.prompt_ids is not None and read.prompt_ids.shape == (3, 4)
    assert [read.prompt(i).tolist() for i in range(3)] == valid_prompts(batch)
    assert (read.prompt_ids[1, 3:] == 0).all() and (read.prompt_ids[2, 1:] == 0).all()


@pytest.mark.parametrize("optional", [True, False])
def test_the_payload_writes_the_bytes_write_capture_writes(
    capture: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, optional: bool
) -> None:
    """The capture writer exists twice: the inserted one (no import of rlprobe-patch in a user's tree) and the
    format's own, `write_capture` (the demo's, the tests'). Given the same arrays, both write the same file, byte
    for byte (the zip's entries in the same order; its timestamps, the clock's, held still here)."""
    monkeypatch.setattr(time, "time", lambda: 1_800_000_000.0)
    rng = np.random.default_rng(44)
    rows, width = 4, 6
    mask = np.arange(width)[None, :] < np.array([6, 3, 0, 5])[:, None]
    arrays: dict[str, Any] = {
        "request_ids": ["req-0", "req-1", "", "pad"],
        "prompt_lengths": np.array([4, 3, 1, 2]),
        "responses": rng.integers(0, 50_000, (rows, width)),
        "response_mask": mask.astype(np.int64),
        "rollout_log_probs": -rng.random((rows, width)).astype(np.float32),
        "old_log_probs": -rng.random((rows, width)).astype(np.float32),
        "source": "verl RayPPOTrainer",
    }
    if optional:
        sampling = {"temperature": 0.7, "top_p": 0.9, "logprobs_mode": "processed_logprobs"}
        provenance = {"verl_version": "0.9.1", "training_dtype": "bfloat16", "rollout_dtype": "bfloat16"}
        arrays |= {
            "ref_log_prob": -rng.random((rows, width)).astype(np.float32),
            "dataset_index": np.array([7, 8, -1, 9]),
            "prompt_ids": rng.integers(1, 1000, (rows, 4)),
            "raw_prompts": ['[{"role": "user", "content": "q0"}]', "q1", "", "q3"],
        }
    keep = np.array([True, True, True, False])  # the last row pads the batch: no request
    inserted = capture()._rlprobe_write_logprobs(
        str(tmp_path / "inserted"),
        12,
        arrays | ({"sampling": json.dumps(sampling), "provenance": json.dumps(provenance)} if optional else {}),
        keep,
    )
    own = write_capture(
        tmp_path / "format",
        step=12,
        keep=keep,
        **arrays,
        **({"sampling": sampling, "provenance": provenance} if optional else {}),
    )
    assert Path(inserted).name == Path(own).name == "step-000012.rlprobe-logprobs.npz"
    assert Path(inserted).read_bytes() == Path(own).read_bytes()
    assert read_capture(Path(own)).request_ids == ["req-0", "req-1", ""]


def valid_prompts(batch: Any) -> list[list[int]]:
    """Each row's prompt tokens where the attention mask is 1, computed here by boolean indexing."""
    prompts = batch.batch["prompts"].array
    mask = batch.batch["attention_mask"].array[:, : prompts.shape[1]].astype(bool)
    return [prompts[i][mask[i]].tolist() for i in range(len(prompts))]


def _written(capture: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch: Any, trainer: Any = None) -> Any:
    monkeypatch.setenv("MISMATCH_ON", "1")
    monkeypatch.setenv("MISMATCH_DIR", str(tmp_path))
    capture()._rlprobe_capture_logprobs(trainer or types.SimpleNamespace(global_steps=5), batch)
    return read_capture(tmp_path / "step-000005.rlprobe-logprobs.npz")


def test_prompt_ids_are_what_the_forward_scored(capture: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`input_ids`' prompt columns, not `prompts`, where the two differ: the forward scores input_ids."""
    batch = _batch()
    scored = batch.batch["input_ids"].array.copy()
    scored[0, 2] = 4242  # a token the trainer saw and the rollout's prompt did not
    batch.batch["input_ids"] = FakeTensor(scored)
    read = _written(capture, tmp_path, monkeypatch, batch)
    expected = valid_prompts(batch)
    expected[0][2] = 4242
    assert [read.prompt(i).tolist() for i in range(3)] == expected


def test_prompt_ids_from_prompts_or_left_out(
    capture: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    batch = _batch()
    del batch.batch["input_ids"]
    read = _written(capture, tmp_path, monkeypatch, batch)
    assert [read.prompt(i).tolist() for i in range(3)] == valid_prompts(batch)
    del batch.batch["prompts"]  # neither: no prompt_ids column, the step still written
    read = _written(capture, tmp_path, monkeypatch, batch)
    assert read.prompt_ids is None and read.samples == 3
    batch.batch["prompts"] = "not a tensor"  # unreadable: left out, said once
    for _ in range(2):
        read = _written(capture, tmp_path, monkeypatch, batch)
        assert read.prompt_ids is None and read.samples == 3
    assert capsys.readouterr().err.count("the capture reads no 'prompt_ids' from the batch (AttributeError") == 1


class FakeTransferQueue(types.ModuleType):
    """`transfer_queue` as the V1 capture calls it: `kv_batch_get(keys, partition_id, select_fields)`
    returns {field: one value per row} of stored rows (a list, as tensordict's LinkedList is one),
    and raises for a field the rows lack (TransferQueue 0.1.11 does, or returns no such field)."""

    def __init__(self, rows: dict[str, dict[str, Any]], broken: tuple[str, ...] = ()) -> None:
        super().__init__("transfer_queue")
        self.rows, self.broken, self.calls = rows, broken, []

    def kv_batch_get(self, keys: list[str], partition_id: str, select_fields: list[str]) -> dict[str, list[Any]]:
        self.calls.append((partition_id, tuple(select_fields)))
        (field,) = select_fields
        if field in self.broken:
            raise ConnectionError("storage unit gone")
        if any(field not in self.rows[key] for key in keys):
            raise RuntimeError(f"field {field} not found")
        return {field: [self.rows[key][field] for key in keys]}


class KVBatchMeta:  # what the capture reads of TransferQueue's KVBatchMeta
    def __init__(self, tags: list[dict[str, Any]]) -> None:
        self.keys = [f"uid{i}_0_0" for i in range(len(tags))]
        self.tags, self.partition_id, self.fields = tags, "train", None

    def __len__(self) -> int:
        return len(self.keys)


def _stored_rows(meta: KVBatchMeta, raw_prompt: bool = True) -> dict[str, dict[str, Any]]:
    """The rows as the agent loop stores them; the padding row (uid1) copies uid0's fields."""
    rows: dict[str, dict[str, Any]] = {}
    for i, key in enumerate(meta.keys):
        n = 0 if meta.tags[i].get("is_padding") else i
        row: dict[str, Any] = {"extra_fields": {"request_id": f"req-{n}", "max_global_steps": 1}, "index": 40 + n}
        if raw_prompt:
            row["raw_prompt"] = [{"role": "user", "content": f"q{n}"}]
        # prompt then response, unpadded (a row of a jagged tensor): its first prompt_len are the prompt
        row["input_ids"] = FakeTensor(stored_prompt(n, meta.tags[i]["prompt_len"]) + [900 + n] * 3)
        rows[key] = row
    return rows


def stored_prompt(n: int, length: int) -> list[int]:
    return [100 * (n + 1) + j for j in range(length)]


def test_v1_rows_from_transferqueue_padding_is_no_request(
    capture: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MISMATCH_ON", "yes")
    monkeypatch.setenv("MISMATCH_DIR", str(tmp_path))
    data = _batch(ref=False)
    meta = KVBatchMeta([{"prompt_len": 4}, {"prompt_len": 3, "is_padding": True}, {"prompt_len": 1}])
    tq = FakeTransferQueue(_stored_rows(meta))
    monkeypatch.setitem(sys.modules, "transfer_queue", tq)
    capture()._rlprobe_capture_kv_logprobs(types.SimpleNamespace(global_steps=1), meta, data)
    read = read_capture(tmp_path / "step-000001.rlprobe-logprobs.npz")
    assert read.samples == 2 and read.prompt_lengths.tolist() == [4, 1] and read.ref is None
    assert read.mask.sum(axis=1).tolist() == [5, 0]
    # The padding row carries req-0 too (a copy of the first real row): it is no request.
    assert read.request_ids == ["req-0", "req-2"]
    assert read.dataset_index is not None and read.dataset_index.tolist() == [40, 42]
    assert read.raw_prompts == ['[{"role": "user", "content": "q0"}]', '[{"role": "user", "content": "q2"}]']
    assert read.prompt_ids is not None and read.prompt_ids.shape == (2, 4)
    assert [read.prompt(i).tolist() for i in range(2)] == [stored_prompt(0, 4), stored_prompt(2, 1)]
    # One read per field, on the batch's keys and partition.
    fields = ("extra_fields", "index", "raw_prompt", "input_ids")
    assert tq.calls == [("train", (field,)) for field in fields]


def test_v1_prompt_ids_left_out_where_a_tag_disagrees(
    capture: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MISMATCH_ON", "1")
    monkeypatch.setenv("MISMATCH_DIR", str(tmp_path))
    meta = KVBatchMeta([{"prompt_len": 4}, {"prompt_len": 3}, {"prompt_len": 1}])
    rows = _stored_rows(meta)
    rows["uid1_0_0"]["input_ids"] = FakeTensor([7, 7])  # shorter than its prompt_len tag
    monkeypatch.setitem(sys.modules, "transfer_queue", FakeTransferQueue(rows))
    capture()._rlprobe_capture_kv_logprobs(types.SimpleNamespace(global_steps=1), meta, _batch(ref=False))
    read = read_capture(tmp_path / "step-000001.rlprobe-logprobs.npz")
    assert read.prompt_ids is None and read.request_ids == ["req-0", "req-1", "req-2"]
    err = capsys.readouterr().err
    assert "the capture reads no 'prompt_ids' from the rows' input_ids and prompt_len tags" in err
    assert "row 1: prompt_len 3, 2 input ids" in err


def test_v1_a_field_not_read_leaves_its_column_empty(
    capture: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MISMATCH_ON", "1")
    monkeypatch.setenv("MISMATCH_DIR", str(tmp_path))
    meta = KVBatchMeta([{"prompt_len": 4}, {"prompt_len": 3}, {"prompt_len": 1}])
    rows = _stored_rows(meta, raw_prompt=False)  # a dataset without raw_prompt
    for row in rows.values():
        del row["input_ids"]  # and rows without input_ids (no prompt_ids then)
    rows["uid1_0_0"]["extra_fields"] = {}  # a rollout that did not keep the request id
    monkeypatch.setitem(sys.modules, "transfer_queue", FakeTransferQueue(rows, broken=("index",)))
    for step in (1, 2):
        capture()._rlprobe_capture_kv_logprobs(types.SimpleNamespace(global_steps=step), meta, _batch(ref=False))
    read = read_capture(tmp_path / "step-000002.rlprobe-logprobs.npz")
    assert read.sampling is None  # a trainer without a readable config: no settings, and the step still written
    assert read.provenance is None
    assert read.request_ids == ["req-0", "", "req-2"]
    assert read.dataset_index is None and read.raw_prompts is None and read.prompt_ids is None
    err = capsys.readouterr().err
    # Said once per process and field, naming what went wrong; the steps still wrote their files.
    assert err.count("the capture reads no 'index' from TransferQueue (ConnectionError: storage unit gone)") == 1
    assert err.count("the capture reads no 'raw_prompt' from TransferQueue (RuntimeError") == 1
    assert err.count("the capture reads no 'input_ids' from TransferQueue (RuntimeError") == 1
    assert err.count("the capture reads no 'training_dtype' from the config (AttributeError") == 1


def test_off_the_batch_is_not_touched(capture: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    # Off, the V1 capture makes no TransferQueue call (and numpy is not imported: Untouchable batches).
    monkeypatch.setitem(sys.modules, "transfer_queue", Untouchable())
    trainer = types.SimpleNamespace(global_steps=1, config=Untouchable())
    capture()._rlprobe_capture_logprobs(trainer, Untouchable())
    capture()._rlprobe_capture_kv_logprobs(trainer, Untouchable(), Untouchable())
    capture()._rlprobe_capture_precondition(trainer)
    assert list(tmp_path.iterdir()) == []


def test_no_rollout_log_probs_fails_loudly(capture: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MISMATCH_ON", "1")
    monkeypatch.setenv("MISMATCH_DIR", str(tmp_path))
    batch = _batch()
    del batch.batch["rollout_log_probs"]
    with pytest.raises(RuntimeError, match=r"step 3 holds no rollout_log_probs.*calculate_log_probs=True"):
        capture()._rlprobe_capture_logprobs(types.SimpleNamespace(global_steps=3), batch)
    assert list(tmp_path.iterdir()) == []


class Config(dict):
    """What the capture reads of verl's DictConfig: attributes (AttributeError where absent) and .get."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


@pytest.mark.parametrize(
    ("bypass", "calculate", "message"),
    [(True, True, "bypass_mode=True"), (False, False, "calculate_log_probs is off"), (None, True, None)],
)
def test_the_precondition_names_the_setting(
    capture: Any, monkeypatch: pytest.MonkeyPatch, bypass: bool | None, calculate: bool, message: str | None
) -> None:
    monkeypatch.setenv("MISMATCH_ON", "on")
    correction = None if bypass is None else Config(bypass_mode=bypass)
    config = Config(
        algorithm=Config(rollout_correction=correction),
        actor_rollout_ref=Config(rollout=Config(calculate_log_probs=calculate)),
    )
    trainer = types.SimpleNamespace(config=config)
    if message is None:
        capture()._rlprobe_capture_precondition(trainer)
    else:
        with pytest.raises(RuntimeError, match=message):
            capture()._rlprobe_capture_precondition(trainer)


def test_a_wrong_switch_value_names_the_variable(capture: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MISMATCH_ON", "maybe")
    with pytest.raises(ValueError, match="MISMATCH_ON='maybe'"):
        capture()._rlprobe_capture_logprobs(types.SimpleNamespace(global_steps=1), Untouchable())


def test_a_truncated_capture_is_refused_by_name(capture: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MISMATCH_ON", "1")
    monkeypatch.setenv("MISMATCH_DIR", str(tmp_path))
    capture()._rlprobe_capture_logprobs(types.SimpleNamespace(global_steps=2), _batch())
    path = tmp_path / "step-000002.rlprobe-logprobs.npz"
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(RefusedError, match=str(path)):
        read_capture(path)


@pytest.fixture
def verl_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A stand-in `verl` package (its version, and whether `verl.workers.engine_workers` exists: the
    engine workers appear in 0.7.0), for the provenance's reading of the run's release."""

    def make(version: str, engine_workers: bool) -> None:
        workers = tmp_path / f"verl-{version}" / "verl" / "workers"
        workers.mkdir(parents=True)
        if engine_workers:
            (workers / "engine_workers.py").write_text("")
        verl = types.ModuleType("verl")
        verl.__path__ = [str(workers.parent)]
        verl.__version__ = version  # type: ignore[attr-defined]
        package = types.ModuleType("verl.workers")
        package.__path__ = [str(workers)]
        monkeypatch.setitem(sys.modules, "verl", verl)
        monkeypatch.setitem(sys.modules, "verl.workers", package)
        monkeypatch.delitem(sys.modules, "verl.workers.engine_workers", raising=False)

    return make


def run_config(strategy: str = "fsdp", legacy: str | None = None, rollout_dtype: Any = "bfloat16", **actor: Any) -> Any:
    """The parts of verl's composed config the provenance reads (attributes and .get, as a DictConfig)."""
    trainer = Config() if legacy is None else Config(use_legacy_worker_impl=legacy)
    rollout = Config(name="vllm", dtype=rollout_dtype)
    return Config(trainer=trainer, actor_rollout_ref=Config(actor=Config(strategy=strategy, **actor), rollout=rollout))


MIXED_FP32 = Config(param_dtype="fp32")


@pytest.mark.parametrize(
    ("version", "config", "training_dtype"),
    [
        # the engine workers of 0.8.0+ (no use_legacy_worker_impl): autocast to mixed_precision's param dtype
        ("0.9.1", run_config(fsdp_config=Config(dtype="bfloat16")), "bfloat16"),
        ("0.9.1", run_config(fsdp_config=Config(dtype="bfloat16", mixed_precision=MIXED_FP32)), "float32"),
        ("0.8.0", run_config(fsdp_config=Config(dtype="float16", mixed_precision=Config())), "bfloat16"),
        # the legacy workers: autocast to fsdp_config.dtype whatever the param dtype; float32 does nothing
        (
            "0.7.1",
            run_config(legacy="auto", fsdp_config=Config(dtype="float16", mixed_precision=MIXED_FP32)),
            "float16",
        ),
        ("0.6.1", run_config(legacy="auto", fsdp_config=Config(dtype="float32")), "float32"),
        ("0.6.1", run_config(legacy="auto", fsdp_config=Config(dtype="fp32", mixed_precision=Config())), "bfloat16"),
        ("0.6.0", run_config(legacy="auto", fsdp_config=Config(mixed_precision=MIXED_FP32)), "bfloat16"),
        # disable: the engine workers from 0.7.0 (autocast to bfloat16 before 0.8.0); 0.6.x has none
        (
            "0.7.0",
            run_config(legacy="disable", fsdp_config=Config(dtype="float16", mixed_precision=MIXED_FP32)),
            "bfloat16",
        ),
        ("0.6.1", run_config(legacy="disable", fsdp_config=Config(dtype="float16")), "float16"),
        # Megatron: megatron.dtype, bfloat16 where the release has no such key (0.6.0)
        ("0.9.1", run_config("megatron", megatron=Config(dtype="float16")), "float16"),
        ("0.6.0", run_config("megatron", legacy="auto", megatron=Config()), "bfloat16"),
        # a strategy whose dtype the capture does not know: none said
        ("0.9.1", run_config("veomni"), None),
    ],
)
def test_provenance_training_dtype_as_verl_decides(
    capture: Any, verl_package: Any, version: str, config: Any, training_dtype: str | None
) -> None:
    from packaging.version import Version

    verl_package(version, engine_workers=Version(version) >= Version("0.7.0"))
    provenance = json.loads(capture()._rlprobe_provenance(types.SimpleNamespace(config=config)))
    strategy = config.actor_rollout_ref.actor.strategy
    expected = {"verl_version": version, "training_strategy": strategy, "rollout_name": "vllm"}
    expected |= {"rollout_dtype": "bfloat16"} | ({"training_dtype": training_dtype} if training_dtype else {})
    assert provenance == expected


@pytest.mark.parametrize(
    ("written", "name"), [("bf16", "bfloat16"), ("half", "float16"), ("float", "float32"), ("auto", "auto")]
)
def test_provenance_names_a_dtype_as_torch_does(
    capture: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, verl_package: Any, written: str, name: str
) -> None:
    verl_package("0.9.1", engine_workers=True)
    config = run_config(rollout_dtype=written, fsdp_config=Config(mixed_precision=Config(param_dtype=written)))
    trainer = types.SimpleNamespace(global_steps=5, config=Config(config, algorithm=Config()))
    read = _written(capture, tmp_path, monkeypatch, _batch(), trainer)
    assert read.provenance is not None
    assert (read.provenance["training_dtype"], read.provenance["rollout_dtype"]) == (name, name)
