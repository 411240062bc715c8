"""Run in the verl 0.9.1 test venv (torch, verl, msprobe): verl's own metrics on random batches, and a
real msprobe compare of a small model against a copy with one perturbed layer.

    <venv>/bin/python tests/runtime/report_driver.py --out DIR

Writes DIR/batch-<name>.npz (the tensors, as numpy) and DIR/verl.json (verl's numbers per batch),
and DIR/compare/<pair>/compare_result_*.csv (msprobe's compare; layer `2` perturbed in pair `001`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

import numpy as np
import torch
from verl.protocol import DataProto
from verl.trainer.ppo.rollout_corr_helper import compute_offpolicy_metrics
from verl.utils.debug.metrics import calculate_debug_metrics


def batches(dtype: torch.dtype):
    gen = torch.Generator().manual_seed(1234)
    shapes = {
        "random": [37, 5, 64, 1, 12, 64, 0, 50],
        "one-token": [1],
        "empty-and-one": [0, 1, 0],
        "all-full": [16, 16, 16],
    }
    for name, lengths in shapes.items():
        width = max(max(lengths), 1)
        training = torch.log(torch.rand(len(lengths), width, generator=gen, dtype=torch.float64) * 0.99 + 0.01)
        rollout = training + 0.3 * torch.randn(len(lengths), width, generator=gen, dtype=torch.float64)
        mask = torch.zeros(len(lengths), width, dtype=torch.bool)
        for i, n in enumerate(lengths):
            mask[i, :n] = True
        yield f"{name}-{str(dtype).split('.')[-1]}", training.to(dtype), rollout.to(dtype), mask


def plain(value):
    value = value.item() if hasattr(value, "item") else value
    return None if isinstance(value, float) and math.isnan(value) else value


def metrics(out: Path) -> None:
    results = {}
    for dtype in (torch.float64, torch.float32):
        for name, training, rollout, mask in batches(dtype):
            responses = torch.zeros(mask.shape, dtype=torch.long)
            data = DataProto.from_dict(
                tensors={
                    "rollout_log_probs": rollout,
                    "old_log_probs": training,
                    "response_mask": mask.long(),
                    "responses": responses,
                }
            )
            entry = {"debug": {k: plain(v) for k, v in calculate_debug_metrics(data).items()}}
            if mask.any():
                entry["offpolicy"] = {
                    k: plain(v) for k, v in compute_offpolicy_metrics(training, rollout, mask.float()).items()
                }
            results[name] = entry
            np.savez(
                out / f"batch-{name}.npz",
                training=training.double().numpy(),
                rollout=rollout.double().numpy(),
                mask=mask.numpy(),
            )
    (out / "verl.json").write_text(json.dumps(results))


def compare(out: Path) -> None:
    from msprobe.pytorch import PrecisionDebugger
    from msprobe.pytorch.compare.pt_compare import pt_compare

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh()) for _ in range(4)])
    x = torch.randn(3, 16)
    dumps = {}
    for side, perturb in (("bench", False), ("target", True)):
        m = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh()) for _ in range(4)])
        m.load_state_dict(model.state_dict())
        if perturb:
            with torch.no_grad():
                m[2][0].weight.mul_(-1.0)
        config = out / f"config-{side}.json"
        config.write_text(
            json.dumps(
                {
                    "task": "tensor",
                    "dump_path": str(out / "dump" / side),
                    "rank": [],
                    "step": [],
                    "level": "L0",
                    "async_dump": False,
                }
            )
        )
        debugger = PrecisionDebugger(config_path=str(config))
        debugger.start(m)
        with torch.no_grad():
            m(x)
        debugger.stop()
        debugger.step()
        PrecisionDebugger._instance = None
        dumps[side] = next((out / "dump" / side / "step0").glob("*/dump.json")).parent
    for pair, target in (("000_same", "bench"), ("001_perturbed", "target")):
        dest = out / "compare" / pair
        dest.mkdir(parents=True, exist_ok=True)
        pt_compare(
            {
                "npu_path": str(dumps[target] / "dump.json"),
                "bench_path": str(dumps["bench"] / "dump.json"),
                "is_print_compare_log": False,
            },
            str(dest),
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    metrics(args.out)
    compare(args.out)
    print(json.dumps({"csv": sorted(str(p.relative_to(args.out)) for p in args.out.rglob("compare_result*.csv"))}))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
