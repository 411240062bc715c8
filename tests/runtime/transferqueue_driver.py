"""Run `verl.prompts-only`'s V1 trim for real: patched verl 0.9.1 code against a real TransferQueue.

Run it with the python of the TransferQueue venv (`venvs.ensure_transferqueue_venv`), not pytest's::

    <venv>/bin/python tests/runtime/transferqueue_driver.py --out result.json

Real: TransferQueue (`tq.init` starts its controller and one SimpleStorage unit as Ray actors on
a local Ray instance; every put and get goes through them), `KVBatchMeta`, verl's
`list_of_dict_to_tensordict` (how `AgentLoopWorkerTQ._agent_loop_postprocess` stacks its rows:
jagged where lengths differ) and `upsample_batch_to_divisible_size` (the padding rows
`_balance_batch` adds), imported from the installed verl; `PPOTrainer._prompts_only_kv_batch`
and the statements inserted before `_step_once`'s old-log-prob block, taken from the installed,
patched `trainer_base.py` by syntax tree and executed as written.

Stand-ins: the trainer object around those statements (only the inserted method on it); the
rows' contents (made the way `_agent_loop_postprocess` makes them, from token lists of our
choosing, not from a model); `tq` in the inserted code's namespace is TransferQueue's own module
behind a recorder that counts the calls made through it and passes each on unchanged.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import torch

EOS = 2
# (prompt length, response length) per sample; different lengths make every field jagged.
SAMPLES = {"text": [(5, 3), (4, 6), (7, 2)], "mrope": [(6, 4), (3, 5)]}
LAYERS, TOP_K = 2, 2


class Recorder:
    """TransferQueue's module, with every call through it counted (the calls themselves are real)."""

    def __init__(self, module: Any) -> None:
        self._module = module
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._module, name)
        if not callable(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return value(*args, **kwargs)

        return call


def make_row(sample: int, prompt_len: int, response_len: int, mrope: bool) -> dict[str, torch.Tensor]:
    """One sample's fields as `_agent_loop_postprocess` builds them (AgentLoopOutput.as_dict, then
    input_ids, attention_mask, position_ids, loss_mask), with routed experts and teacher log-probs."""
    total = prompt_len + response_len
    prompts = torch.arange(prompt_len, dtype=torch.int64) + 1000 * (sample + 1)
    responses = torch.arange(response_len, dtype=torch.int64) + 1000 * (sample + 1) + 500
    input_ids = torch.cat([prompts, responses], dim=0)
    attention_mask = torch.ones_like(input_ids, dtype=torch.int64)
    positions = torch.arange(total, dtype=torch.int64)
    response_mask = torch.ones(response_len, dtype=torch.int64)
    return {
        "prompts": prompts,
        "responses": responses,
        "response_mask": response_mask,
        "rollout_log_probs": -torch.rand(response_len),
        "routed_experts": torch.randint(0, 8, (total, LAYERS, TOP_K), dtype=torch.int16),
        "teacher_ids": input_ids.clone(),
        "teacher_logprobs": -torch.rand(total),
        "rm_scores": torch.zeros(response_len),
        "loss_mask": response_mask,
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        # mrope: (3, L) per sample, as Qwen-VL's get_rope_index gives it after squeeze(0)
        "position_ids": positions.repeat(3, 1) if mrope else positions,
    }


def hand_trim(row: dict[str, torch.Tensor], prompt_len: int) -> dict[str, torch.Tensor]:
    """What the trim must leave, written out field by field."""
    out = dict(row)
    out["input_ids"] = row["input_ids"][:prompt_len]
    out["attention_mask"] = row["attention_mask"][:prompt_len]
    out["position_ids"] = row["position_ids"][..., :prompt_len]
    out["routed_experts"] = row["routed_experts"][:prompt_len]
    out["teacher_ids"] = row["teacher_ids"][:prompt_len]
    out["teacher_logprobs"] = row["teacher_logprobs"][:prompt_len]
    for key in ("responses", "response_mask", "loss_mask", "rollout_log_probs"):
        out[key] = row[key][:0]
    return out  # prompts and rm_scores are left as they are


def trainer_base_path() -> Path:
    spec = importlib.util.find_spec("verl")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent / "trainer" / "ppo" / "v1" / "trainer_base.py"


def inserted_code(path: Path) -> tuple[list[ast.FunctionDef], list[ast.stmt]]:
    """`PPOTrainer._prompts_only_kv_batch` with the switch reader's methods (`_rlprobe_*`), and the
    statements right before `_step_once`'s old-log-prob block."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    trainer = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "PPOTrainer")
    methods = {n.name: n for n in trainer.body if isinstance(n, ast.FunctionDef)}
    step = methods["_step_once"]
    for i, stmt in enumerate(step.body):
        if isinstance(stmt, ast.With) and "old_log_prob" in ast.unparse(stmt.items[0]):
            added = [methods["_prompts_only_kv_batch"]] + [f for n, f in methods.items() if n.startswith("_rlprobe_")]
            return added, step.body[max(0, i - 2) : i]
    raise LookupError("no old_log_prob block in PPOTrainer._step_once")


def fetch_rows(tq: Any, keys: list[str], partition: str) -> list[dict[str, torch.Tensor]]:
    data = tq.kv_batch_get(keys=keys, partition_id=partition)
    rows: list[dict[str, torch.Tensor]] = [{} for _ in keys]
    for key in data.keys():
        value = data[key]
        if isinstance(value, torch.Tensor):
            for i, row in enumerate(value.unbind(0)):
                rows[i][key] = row.clone()
    return rows


def same_rows(a: list[dict[str, torch.Tensor]], b: list[dict[str, torch.Tensor]]) -> list[str]:
    """The differences, as `row i key: ...` lines (empty when equal)."""
    problems = []
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x.keys() != y.keys():
            problems.append(f"row {i}: keys {sorted(x)} != {sorted(y)}")
        for key in sorted(x.keys() & y.keys()):
            if x[key].shape != y[key].shape or not torch.equal(x[key], y[key]):
                problems.append(f"row {i} {key}: {list(x[key].shape)} != {list(y[key].shape)}")
    return problems


def run() -> dict[str, Any]:
    import ray
    import transfer_queue
    from omegaconf import OmegaConf
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size
    from verl.utils import tensordict_utils as tu

    path = trainer_base_path()
    methods, statements = inserted_code(path)
    recorder = Recorder(transfer_queue)
    namespace: dict[str, Any] = {"os": os, "tq": recorder, "tu": tu}
    exec(compile(ast.Module(body=list(methods), type_ignores=[]), str(path), "exec"), namespace)
    hook = compile(ast.Module(body=statements, type_ignores=[]), str(path), "exec")
    Trainer = type("Trainer", (), {m.name: namespace[m.name] for m in methods})  # stand-in: the methods the patch adds

    # A local Ray instance; logical CPUs above the machine's 2 so that the controller and the
    # storage unit (one CPU each) are scheduled.
    # address="local": a new Ray of its own, never the cluster another test may be running on this machine
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    transfer_queue.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
    result: dict[str, Any] = {"hook_source": [ast.unparse(s) for s in statements], "cases": {}}
    try:
        torch.manual_seed(0)
        for name, lengths in SAMPLES.items():
            partition = f"train-{name}"
            rows = [make_row(i, p, r, mrope=name == "mrope") for i, (p, r) in enumerate(lengths)]
            keys = [f"uid{i}_0_0" for i in range(len(rows))]
            tags = [{"status": "success", "prompt_len": p, "response_len": r, "seq_len": p + r} for p, r in lengths]
            transfer_queue.kv_batch_put(
                keys=keys, partition_id=partition, fields=tu.list_of_dict_to_tensordict(rows), tags=tags
            )
            batch = KVBatchMeta(keys=keys, tags=tags, partition_id=partition)
            # verl's own padding rows (copies of row 0 shrunk to a minimal sequence), as _balance_batch adds them
            batch = upsample_batch_to_divisible_size(batch, 4, EOS)
            stored = fetch_rows(transfer_queue, batch.keys, partition)
            prompt_lens = [row["prompts"].size(0) for row in stored]

            case: dict[str, Any] = {"keys": list(batch.keys), "jagged": {}}
            data = transfer_queue.kv_batch_get(keys=batch.keys, partition_id=partition)
            case["jagged"] = {k: bool(getattr(data[k], "is_nested", False)) for k in ("input_ids", "position_ids")}

            os.environ.pop("PROMPTS_ONLY", None)
            recorder.calls.clear()
            # The hooks read the switches once per process: each run here stands for a new process.
            sys.modules.pop("_rlprobe_patch_run", None)
            scope = {"self": Trainer(), "batch": batch, "os": os}
            exec(hook, scope)  # the inserted statements as written, PROMPTS_ONLY unset
            case["unset_calls"] = list(recorder.calls)
            case["unset_same_batch"] = scope["batch"] is batch
            case["unset_differences"] = same_rows(fetch_rows(transfer_queue, batch.keys, partition), stored)

            os.environ["PROMPTS_ONLY"] = "1"
            recorder.calls.clear()
            sys.modules.pop("_rlprobe_patch_run", None)
            scope = {"self": Trainer(), "batch": batch, "os": os}
            exec(hook, scope)
            os.environ.pop("PROMPTS_ONLY", None)
            case["set_calls"] = list(recorder.calls)
            case["set_same_batch"] = scope["batch"] is batch
            after = fetch_rows(transfer_queue, batch.keys, partition)
            expected = [hand_trim(row, n) for row, n in zip(stored, prompt_lens)]
            case["set_differences"] = same_rows(after, expected)
            case["prompt_lens"] = prompt_lens
            case["trimmed_shapes"] = [
                {k: list(row[k].shape) for k in ("input_ids", "position_ids", "responses", "routed_experts")}
                for row in after
            ]
            result["cases"][name] = case
    finally:
        transfer_queue.close()
        ray.shutdown()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    try:
        result = run()
        result["ok"] = True
    except Exception:
        result = {"ok": False, "error": traceback.format_exc()}
    args.out.write_text(json.dumps(result, indent=2, default=str))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
