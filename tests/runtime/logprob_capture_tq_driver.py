"""Run `verl.logprob-capture` in verl 0.9.1's V1 trainer for real: the patched
`PPOTrainer._compute_old_log_prob` against a real TransferQueue.

Run it with the python of the TransferQueue venv (`venvs.ensure_transferqueue_venv`), not pytest's::

    <venv>/bin/python tests/runtime/logprob_capture_tq_driver.py --out DIR

Real: TransferQueue (`tq.init` on a local Ray instance: its controller and one SimpleStorage unit
are Ray actors; every put and get goes through them), `KVBatchMeta`; the rows, each built as
`AgentLoopWorkerTQ._agent_loop_postprocess` builds it (`AgentLoopOutput.as_dict()`'s fields,
updated with the prompt's kwargs: `extra_fields` holding the request id `verl.request-id` keeps
there, the dataset `index`, the `raw_prompt` chat, `uid`, `session_id`, ...) and stacked by verl's
`list_of_dict_to_tensordict`, with its tags; verl's own padding rows
(`upsample_batch_to_divisible_size`, copies of the first real row's fields); the method
`PPOTrainer._compute_old_log_prob` and the class `_RlprobeLogprobCapture`, taken from the
installed, patched `trainer_base.py` by syntax tree and executed as written (the patch's two hook
lines in it), with verl's own `DataProto`, `response_from_nested`, `agg_loss` and
`calculate_debug_metrics`.

The run's config is verl's own, composed by Hydra from its `ppo_trainer.yaml` (step 2: FSDP, with a
launch's dtypes) and `ppo_megatron_trainer.yaml` (step 3: Megatron), as
tests/runtime/logprob_capture_driver.py composes it.

Stand-ins: the trainer object (`config`, `global_steps`); its actor worker group, whose
`compute_log_prob` writes the fields the actor writes (`log_probs` and `entropy`, nested over
prompt and response, shifted by one token as the engine gives them) into TransferQueue, from
numbers of our choosing (the rollout log-probs minus a known drift); the rows' token contents;
`tq`, in the method's namespace and as `transfer_queue` in `sys.modules` while the method runs, is
TransferQueue's own module behind recorders that log each call and pass it on unchanged.
Writes `result.json` and the captures (`captures/`) under `--out`.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import torch
from logprob_capture_driver import composed_config, config_dtypes
from transferqueue_driver import trainer_base_path

EOS = 2
BATCH_MULTIPLE = 4  # rows are padded to a multiple of this, as _balance_batch pads for dp and mini-batches


class Recorder:
    """TransferQueue's module, with each call through it logged as `who:name` (the calls are real)."""

    def __init__(self, module: Any, who: str, calls: list[str]) -> None:
        self._module, self._who, self._calls = module, who, calls

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._module, name)
        if not callable(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            self._calls.append(f"{self._who}:{name}")
            return value(*args, **kwargs)

        return call


def inserted_code(path: Path) -> tuple[ast.FunctionDef, ast.ClassDef]:
    """`PPOTrainer._compute_old_log_prob` and the appended `_RlprobeLogprobCapture`, as the file holds them."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    method = next(
        n for n in classes["PPOTrainer"].body if isinstance(n, ast.FunctionDef) and n.name == "_compute_old_log_prob"
    )
    return method, classes["_RlprobeLogprobCapture"]


def make_row(sample: dict[str, Any], step: int) -> dict[str, Any]:
    """One TransferQueue row as `_agent_loop_postprocess` builds it: `AgentLoopOutput.as_dict()`
    (prompts, responses, response_mask, rollout_log_probs, num_turns, metrics, extra_fields), updated
    with the prompt's kwargs, then loss_mask, input_ids, position_ids, multi_modal_inputs."""
    n, prompt_len, response_len = sample["n"], sample["prompt_len"], sample["response_len"]
    prompts = torch.arange(prompt_len, dtype=torch.int64) + 1000 * (n + 1)
    responses = torch.arange(response_len, dtype=torch.int64) + 1000 * (n + 1) + 500
    extra_fields: dict[str, Any] = {"min_global_steps": step, "max_global_steps": step}
    if sample["request_id"] is not None:
        extra_fields["request_id"] = sample["request_id"]  # where verl.request-id keeps it
    field: dict[str, Any] = {
        "prompts": prompts,
        "responses": responses,
        "response_mask": torch.ones(response_len, dtype=torch.int64),
        "rollout_log_probs": torch.tensor(sample["rollout"], dtype=torch.float32),
        "num_turns": 2,
        "metrics": {"generate_sequences": 0.01, "tool_calls": 0.0},
        "extra_fields": extra_fields,
    }
    kwargs: dict[str, Any] = {
        "data_source": "openai/gsm8k",
        "agent_name": "single_turn_agent",
        "index": sample["index"],
        "uid": sample["uid"],
        "session_id": 0,
        "global_steps": step,
    }
    if "raw_prompt" in sample:
        kwargs["raw_prompt"] = sample["raw_prompt"]
    field.update(kwargs)
    input_ids = torch.cat([prompts, responses], dim=0)
    field["loss_mask"] = field["response_mask"]
    field["input_ids"] = input_ids
    field["position_ids"] = torch.arange(input_ids.size(0), dtype=torch.int64)
    field["multi_modal_inputs"] = {}
    return field


def make_tag(sample: dict[str, Any], step: int) -> dict[str, Any]:
    prompt_len, response_len = sample["prompt_len"], sample["response_len"]
    return {
        "status": "success",
        "prompt_len": prompt_len,
        "response_len": response_len,
        "seq_len": prompt_len + response_len,
        "global_steps": step,
        "min_global_steps": step,
        "max_global_steps": step,
    }


def drift(j: int) -> float:
    """What the stand-in actor's log-prob of response token j differs by from the rollout's."""
    return 0.01 * (j + 1)


class ActorWorkerGroup:
    """Stand-in for `actor_rollout_wg`: `compute_log_prob` writes `log_probs` and `entropy` for the
    batch's rows into TransferQueue, as the actor does (one value per sequence position; the
    log-prob of token t+1 at t), and returns the batch's meta."""

    def __init__(self, tq: Any) -> None:
        self.tq = tq

    def compute_log_prob(self, batch: Any) -> Any:
        rows = self.tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["prompts", "rollout_log_probs"]
        )
        log_probs, entropy = [], []
        for prompts, rollout in zip(rows["prompts"].unbind(), rows["rollout_log_probs"].unbind(), strict=True):
            p, r = prompts.size(0), rollout.size(0)
            values = torch.zeros(p + r)
            values[p - 1 : p + r - 1] = rollout - torch.tensor([drift(j) for j in range(r)])
            log_probs.append(values)
            entropy.append(torch.full((p + r,), 0.5))
        from tensordict import TensorDict

        fields = TensorDict(
            {
                "log_probs": torch.nested.as_nested_tensor(log_probs, layout=torch.jagged),
                "entropy": torch.nested.as_nested_tensor(entropy, layout=torch.jagged),
            },
            batch_size=[len(batch)],
        )
        return self.tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=fields)


def samples(step: int, count: int, raw_prompt: bool, no_request_id: tuple[int, ...] = ()) -> list[dict[str, Any]]:
    g = torch.Generator().manual_seed(step)
    out = []
    for n in range(count):
        response_len = 2 + (3 * n + step) % 7  # different lengths: every field is jagged
        sample: dict[str, Any] = {
            "n": n,
            "uid": f"uid{step}{n}",
            "prompt_len": 4 + (n * 5 + step) % 6,
            "response_len": response_len,
            "request_id": None if n in no_request_id else f"{step:02d}{n:030x}",
            "index": 100 * step + 7 * n,
            "rollout": (-torch.rand(response_len, generator=g) * 3).tolist(),
        }
        if raw_prompt:
            sample["raw_prompt"] = [
                {"role": "system", "content": "Let's think step by step."},
                {"role": "user", "content": f"question {n} of step {step}"},
            ]
        out.append(sample)
    return out


def run(out: Path) -> dict[str, Any]:
    import ray
    import transfer_queue
    from omegaconf import OmegaConf
    from transfer_queue import KVBatchMeta
    from verl.protocol import DataProto
    from verl.trainer.ppo.core_algos import agg_loss
    from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size
    from verl.utils import tensordict_utils as tu
    from verl.utils.debug.metrics import calculate_debug_metrics
    from verl.workers.utils.padding import response_from_nested

    path = trainer_base_path()
    method, capture_class = inserted_code(path)
    calls: list[str] = []
    namespace: dict[str, Any] = {
        "tq": Recorder(transfer_queue, "trainer", calls),
        "KVBatchMeta": KVBatchMeta,
        "DataProto": DataProto,
        "agg_loss": agg_loss,
        "calculate_debug_metrics": calculate_debug_metrics,
        "response_from_nested": response_from_nested,
    }
    exec(compile(ast.Module(body=[capture_class, method], type_ignores=[]), str(path), "exec"), namespace)
    compute_old_log_prob = namespace["_compute_old_log_prob"]

    launch = ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.calculate_log_probs=True"]
    configs = {
        # FSDP with both sides' dtypes set by the launch
        "fsdp": composed_config(
            [
                *launch,
                "actor_rollout_ref.rollout.dtype=float16",
                "+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
            ]
        ),
        # Megatron with its dtype set, the rollout's left at verl's default
        "megatron": composed_config(
            [*launch, "actor_rollout_ref.actor.megatron.dtype=float16"], "ppo_megatron_trainer"
        ),
        "bypass": composed_config([*launch, "algorithm.rollout_correction.bypass_mode=True"]),
    }

    class Trainer:  # stand-in: what _compute_old_log_prob and the capture read of the trainer
        def __init__(self, step: int, config: str) -> None:
            self.global_steps = step
            self.config = configs[config]
            self.actor_rollout_wg = ActorWorkerGroup(transfer_queue)

    def batch_of(step: int, rows: list[dict[str, Any]], order: list[int]) -> Any:
        """The step's rows put into TransferQueue (as the agent loop puts them), then the batch meta
        in `order` (as `_balance_batch` reorders keys) and padded by verl to BATCH_MULTIPLE."""
        partition = f"train-step{step}"
        keys = [f"{s['uid']}_0_0" for s in rows]
        tags = [make_tag(s, step) for s in rows]
        fields = tu.list_of_dict_to_tensordict([make_row(s, step) for s in rows])
        transfer_queue.kv_batch_put(keys=keys, partition_id=partition, fields=fields, tags=tags)
        batch = KVBatchMeta(keys=[keys[i] for i in order], tags=[tags[i] for i in order], partition_id=partition)
        return upsample_batch_to_divisible_size(batch, BATCH_MULTIPLE, EOS)

    def step_once(trainer: Trainer, batch: Any, capture_on: bool) -> dict[str, Any]:
        """`_compute_old_log_prob` once, as a new process would run it (the switches read afresh)."""
        if capture_on:
            os.environ["MISMATCH_ON"] = "1"
        else:
            os.environ.pop("MISMATCH_ON", None)
        sys.modules.pop("_rlprobe_patch_capture", None)
        calls.clear()
        metrics: dict[str, Any] = {}
        # What the capture's `import transfer_queue as tq` gives it while the method runs.
        sys.modules["transfer_queue"] = Recorder(transfer_queue, "capture", calls)
        try:
            returned = compute_old_log_prob(trainer, batch, metrics)
            error = None
        except RuntimeError as exc:
            returned, error = None, str(exc)
        finally:
            sys.modules["transfer_queue"] = transfer_queue
        return {
            "calls": list(calls),
            "error": error,
            "returned_keys": list(returned.keys) if returned is not None else None,
            "metrics": {k: float(v) for k, v in metrics.items()},
        }

    def expected(batch: Any, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """What the capture must hold: the real rows in the batch's order, padding left out."""
        by_key = {f"{s['uid']}_0_0": s for s in rows}
        real = [by_key[k] for k, t in zip(batch.keys, batch.tags, strict=True) if not t.get("is_padding")]
        return {
            "keys": list(batch.keys),
            "padding": sum(bool(t.get("is_padding")) for t in batch.tags),
            "request_ids": [s["request_id"] or "" for s in real],
            "dataset_index": [s["index"] for s in real],
            "raw_prompts": [json.dumps(s["raw_prompt"]) for s in real] if "raw_prompt" in real[0] else None,
            "prompt_lengths": [s["prompt_len"] for s in real],
            "prompt_ids": [(torch.arange(s["prompt_len"]) + 1000 * (s["n"] + 1)).tolist() for s in real],
            "responses": [(torch.arange(s["response_len"]) + 1000 * (s["n"] + 1) + 500).tolist() for s in real],
            "rollout": [s["rollout"] for s in real],
            "training": [[v - drift(j) for j, v in enumerate(s["rollout"])] for s in real],
        }

    os.environ["MISMATCH_DIR"] = str(out / "captures")
    # A local Ray instance; logical CPUs above the machine's 2 so that the controller and the
    # storage unit (one CPU each) are scheduled.
    # address="local": a new Ray of its own, never the cluster another test may be running on this machine
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    transfer_queue.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
    hooks = [ast.unparse(s) for s in method.body if "_RlprobeLogprobCapture" in ast.unparse(s)]
    result: dict[str, Any] = {"hooks": hooks, "config_dtypes": {k: config_dtypes(c) for k, c in configs.items()}}
    try:
        # Step 1, capture off: the trainer's own calls only, no file.
        rows = samples(1, 3, raw_prompt=True)
        batch = batch_of(1, rows, [0, 1, 2])
        result["off"] = step_once(Trainer(1, "fsdp"), batch, capture_on=False)
        result["files_after_off"] = sorted(p.name for p in (out / "captures").glob("*"))

        # Step 2: 3 rows in a balanced order, one padding row of verl's.
        rows = samples(2, 3, raw_prompt=True)
        batch = batch_of(2, rows, [2, 0, 1])
        result["step2"] = {**step_once(Trainer(2, "fsdp"), batch, capture_on=True), "expected": expected(batch, rows)}

        # Step 3: 5 rows, 3 padding rows; a row the rollout sent without verl.request-id, and a
        # dataset without raw_prompt (TransferQueue has no such field: that column stays empty); Megatron.
        rows = samples(3, 5, raw_prompt=False, no_request_id=(3,))
        batch = batch_of(3, rows, [4, 1, 3, 0, 2])
        result["step3"] = {
            **step_once(Trainer(3, "megatron"), batch, capture_on=True),
            "expected": expected(batch, rows),
        }

        # Bypass mode with the capture on: refused at the top of the method, before any TransferQueue call.
        result["bypass"] = step_once(Trainer(4, "bypass"), batch, capture_on=True)
    finally:
        transfer_queue.close()
        ray.shutdown()
    result["files"] = sorted(p.name for p in (out / "captures").iterdir())
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    try:
        result = {"ok": True, **run(args.out)}
    except Exception:
        result = {"ok": False, "error": traceback.format_exc()}
    (args.out / "result.json").write_text(json.dumps(result, indent=1, default=str))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
