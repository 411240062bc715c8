"""Runs in the verl test venv: `verl.logprob-capture`'s inserted code, taken from the patched
`ray_trainer.py` (the V0 trainer), on verl's own `DataProto` with real torch tensors.

Real: verl (its `DataProto`, `calculate_debug_metrics`), torch, numpy; the run's config, composed by
Hydra from verl's own `ppo_trainer.yaml` with a launch's overrides (`composed_config`); the inserted
class `_RlprobeLogprobCapture` and the hook line as the patch wrote them into the installed file.
Stand-ins: the trainer object (`global_steps`, `config`); the batches' token ids and log-probs (left
padded prompts, `input_ids` the prompt then the response, as verl's rollout builds them). The V1
trainer's capture runs against a real TransferQueue: tests/runtime/logprob_capture_tq_driver.py.
Writes `result.json` and the captures under `--out`.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import sys
import traceback
import types
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf


def verl_file(*parts: str) -> Path:
    spec = importlib.util.find_spec("verl")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent.joinpath(*parts)


def inserted(path: Path, method: str) -> tuple[type, str]:
    """The inserted class, and the hook line the patch put into `method`, from the patched file."""
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "_RlprobeLogprobCapture")
    namespace: dict[str, Any] = {}
    exec(compile(ast.Module(body=[cls], type_ignores=[]), str(path), "exec"), namespace)
    lines = [line.strip() for line in source.splitlines() if "_RlprobeLogprobCapture()._rlprobe_capture_" in line]
    hook = next(line for line in lines if "precondition" not in line)
    assert method in source
    return namespace["_RlprobeLogprobCapture"], hook


def composed_config(overrides: list[str], name: str = "ppo_trainer") -> Any:
    """verl's own config as `python -m verl.trainer.main_ppo` composes it (Hydra), with a launch's overrides."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(verl_file("trainer", "config")), version_base=None):
        return compose(config_name=name, overrides=overrides)


def config_dtypes(config: Any) -> dict[str, Any]:
    """The dtype keys the composed config holds (None where absent), for the test to compare."""
    keys = (
        "actor_rollout_ref.actor.strategy",
        "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype",
        "actor_rollout_ref.actor.megatron.dtype",
        "actor_rollout_ref.rollout.name",
        "actor_rollout_ref.rollout.dtype",
    )
    return {key: OmegaConf.select(config, key, default=None) for key in keys}


def make_batch(rows: int, prompt: int, width: int, seed: int) -> Any:
    from verl import DataProto

    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([width, 1, 0, width // 2, 3][:rows])
    prompt_lens = torch.tensor([prompt, prompt - 1, 2, prompt, 1][:rows])
    response_mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    prompt_mask = (torch.arange(prompt)[None, :] >= (prompt - prompt_lens)[:, None]).long()  # left padded
    rollout = -torch.rand(rows, width, generator=g) * 3
    old = rollout + torch.randn(rows, width, generator=g) * 0.05
    # the padding positions hold ids too (verl's pad id; any id here): the attention mask says what counts
    prompts = torch.randint(1, 1000, (rows, prompt), generator=g)
    responses = torch.randint(0, 1000, (rows, width), generator=g)
    tensors = {
        "prompts": prompts,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "responses": responses,
        "response_mask": response_mask,
        "attention_mask": torch.cat([prompt_mask, response_mask], dim=1),
        "rollout_log_probs": rollout.to(torch.bfloat16).float(),
        "old_log_probs": old.to(torch.bfloat16),
        "ref_log_prob": old - 0.01,
    }
    non_tensor = {
        "request_id": np.array([f"vllm-{seed}-{i}" for i in range(rows)], dtype=object),
        "index": np.array([100 + i for i in range(rows)], dtype=object),
        "raw_prompt": np.array([[{"role": "user", "content": f"question {i}"}] for i in range(rows)], dtype=object),
    }
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensor)


def run(out: Path) -> dict[str, Any]:
    from verl.utils.debug.metrics import calculate_debug_metrics

    result: dict[str, Any] = {}
    # the run's config: step 1 a launch that sets both sides' dtypes, step 2 verl's defaults
    launch = ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.calculate_log_probs=True"]
    launch.append("actor_rollout_ref.rollout.temperature=0.7")
    dtypes = [
        "actor_rollout_ref.rollout.dtype=float16",
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
    ]
    configs = {1: composed_config([*launch, *dtypes]), 2: composed_config(launch)}
    result["config_dtypes"] = {step: config_dtypes(config) for step, config in configs.items()}
    os.environ["MISMATCH_ON"] = "1"
    os.environ["MISMATCH_DIR"] = str(out / "captures")

    # V0: the hook line after `if "rollout_log_probs" in batch.batch.keys(): ...calculate_debug_metrics(batch)`.
    capture, hook = inserted(verl_file("trainer", "ppo", "ray_trainer.py"), "def fit")
    result["v0_hook"] = hook
    trainer = types.SimpleNamespace(global_steps=1, config=configs[1])
    capture()._rlprobe_capture_precondition(trainer)
    result["v0_prompts"] = {}
    for step, rows in ((1, 5), (2, 3)):
        trainer.global_steps, trainer.config = step, configs[step]
        batch = make_batch(rows, prompt=6, width=8, seed=step)
        # what the capture's prompt_ids must hold: each row's prompt where the attention mask is 1
        prompt_mask = batch.batch["attention_mask"][:, :6].bool()
        result["v0_prompts"][step] = [batch.batch["prompts"][i][prompt_mask[i]].tolist() for i in range(rows)]
        result[f"v0_step{step}_metrics"] = {k: float(v) for k, v in calculate_debug_metrics(batch).items()}
        exec(hook, {"_RlprobeLogprobCapture": capture}, {"self": trainer, "batch": batch})

    # Fails loudly: calculate_log_probs off (no rollout_log_probs), and bypass mode, at the first step.
    bare = make_batch(2, prompt=6, width=8, seed=9)
    bare.batch.pop("rollout_log_probs")
    try:
        exec(hook, {"_RlprobeLogprobCapture": capture}, {"self": trainer, "batch": bare})
        result["no_rollout_error"] = None
    except RuntimeError as exc:
        result["no_rollout_error"] = str(exc)
    bypass = types.SimpleNamespace(
        global_steps=1,
        config=OmegaConf.create(
            {
                "algorithm": {"rollout_correction": {"bypass_mode": True}},
                "actor_rollout_ref": {"rollout": {"calculate_log_probs": True}},
            }
        ),
    )
    try:
        capture()._rlprobe_capture_precondition(bypass)
        result["bypass_error"] = None
    except RuntimeError as exc:
        result["bypass_error"] = str(exc)
    result["files"] = sorted(p.name for p in (out / "captures").iterdir())
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    try:
        result = {"ok": True, **run(args.out)}
    except Exception:
        result = {"ok": False, "error": traceback.format_exc()}
    (args.out / "result.json").write_text(json.dumps(result, indent=1))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
