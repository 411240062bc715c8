"""Runs in the verl test venv: `verl.logprob-capture`'s inserted code, taken from the patched
`ray_trainer.py` (the V0 trainer), on verl's own `DataProto` with real torch tensors.

Real: verl (its `DataProto`, `calculate_debug_metrics`), torch, numpy; the inserted class
`_RlprobeLogprobCapture` and the hook line as the patch wrote them into the installed file.
Stand-in: the trainer object (`global_steps`, `config`). The V1 trainer's capture runs against a
real TransferQueue: tests/runtime/logprob_capture_tq_driver.py.
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


def make_batch(rows: int, prompt: int, width: int, seed: int) -> Any:
    from verl import DataProto

    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([width, 1, 0, width // 2, 3][:rows])
    prompt_lens = torch.tensor([prompt, prompt - 1, 2, prompt, 1][:rows])
    response_mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    prompt_mask = (torch.arange(prompt)[None, :] >= (prompt - prompt_lens)[:, None]).long()  # left padded
    rollout = -torch.rand(rows, width, generator=g) * 3
    old = rollout + torch.randn(rows, width, generator=g) * 0.05
    tensors = {
        "prompts": torch.randint(0, 1000, (rows, prompt), generator=g),
        "responses": torch.randint(0, 1000, (rows, width), generator=g),
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
    # the rollout's config as verl ships it (its rollout.yaml), with a temperature a run overrides
    rollout = OmegaConf.load(verl_file("trainer", "config", "rollout", "rollout.yaml"))
    rollout.temperature = 0.7
    config = OmegaConf.create({"algorithm": {"rollout_correction": None}, "actor_rollout_ref": {"rollout": rollout}})
    os.environ["MISMATCH_ON"] = "1"
    os.environ["MISMATCH_DIR"] = str(out / "captures")

    # V0: the hook line after `if "rollout_log_probs" in batch.batch.keys(): ...calculate_debug_metrics(batch)`.
    capture, hook = inserted(verl_file("trainer", "ppo", "ray_trainer.py"), "def fit")
    result["v0_hook"] = hook
    trainer = types.SimpleNamespace(global_steps=1, config=config)
    capture()._rlprobe_capture_precondition(trainer)
    for step, rows in ((1, 5), (2, 3)):
        trainer.global_steps = step
        batch = make_batch(rows, prompt=6, width=8, seed=step)
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
