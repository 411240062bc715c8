"""Write slime's debug dumps with slime's own writers, from unpacked release trees, on the CPU.

Run it with a python that has torch (the megatron venv), not pytest's::

    <venv>/bin/python tests/runtime/slime_debug_writer.py --slime-root <tree> --out <dir> [--slime-root ...]
    <venv>/bin/python tests/runtime/slime_debug_writer.py --logprobs --perturb 12=0.5 --perturb 14@1=-0.3 ...

Real, per tree: `slime.utils.types.Sample` (its `to_dict`), the rollout writer
`RolloutManager._save_debug_rollout_data` of `slime/ray/rollout.py` and the train writer
`slime.utils.train_dump_utils.save_debug_train_data` (imported as it is, on a one-process gloo
group for `torch.distributed.get_rank()`), `torch.save`.

Stand-ins, and why:

* `httpx` (v0.3.x: `slime.utils.types` -> `slime.utils.misc` -> `slime.utils.http_utils` imports it;
  not in this venv; nothing of it is called): a module whose every name is an empty class (a
  module-level annotation names `httpx.AsyncClient`), only when it does not import.
* `RolloutManager`: a Ray actor whose module imports ray and SGLang; its
  `_save_debug_rollout_data` is taken out of `rollout.py` as written (its source, by `ast`) and
  run with the module's names it uses (`Path`, `torch`, `logger`) and a `self` holding `args`.
* the samples and `rollout_data`: ours, shaped as slime makes them (indices 10-13, the request
  ids `slime.request-id` keeps in `metadata["rlprobe_request_ids"]`, a resumed sample 13 with two).
* the `format_version` 2 train dump (after v0.3.1, in no tree here): written by us from its
  documented structure (`{"format_version": 2, "rollout_id", "rank", "samples", "dp_shards"}`,
  samples sorted by rollout position); derived, not slime's writer.

With `--logprobs` (issue 30: the per-sample log-probs `rlprobe-patch report` reads), instead:
samples 10-15 with a response of 2-4 tokens each and `Sample.rollout_log_probs` (a list of floats,
as the rollout engine fills it; v0.3.1's `Sample` checks its length against `response_length`),
through the same real rollout writer; the train side as slime's Megatron actor hands it to
`save_debug_train_data` per data-parallel rank (v0.2.2 / v0.3.1 `actor.py`, `train_actor`): the
rank's share of the rollout (positions `range(rank, n, dp_size)`: v0.2.2's
`_split_train_data_by_dp` without `--balance-data`; v0.3.x's `build_dp_schedule` packs another
order, the same for a join by `sample_index`; `partition` popped by
`slime.utils.data.process_rollout_data`),
`rollout_log_probs` as float32 tensors (`_get_rollout_data`), and `log_probs` as float32 tensors
(`compute_log_prob(store_prefix="")`), which are the rollout's plus the `--perturb` offsets:
`INDEX=DELTA` on every response token of sample INDEX, `INDEX@K=DELTA` on token K only.
Stand-ins besides the above: the training log-probs themselves (ours, not a model's), and the
rank: `torch.distributed.get_rank` answers each data-parallel rank in turn while slime's writer
runs (one process here), so the writer names each rank's file itself (`{rollout_id}_{rank}.pt`).

Output JSON (stdout, last line): the files written per tree and the stand-ins.
"""

from __future__ import annotations

import argparse
import ast
import json
import logging
import socket
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import torch

STANDINS: list[str] = []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _import_tree(root: Path) -> types.ModuleType:
    for name in [m for m in sys.modules if m == "slime" or m.startswith("slime.")]:
        del sys.modules[name]
    sys.path.insert(0, str(root))
    try:
        import httpx  # noqa: F401
    except ImportError:
        stub = types.ModuleType("httpx")
        stub.__getattr__ = lambda name: type(name, (), {})  # type: ignore[method-assign]  # annotations only
        sys.modules["httpx"] = stub
        STANDINS.append("httpx: a module of empty classes (slime.utils.http_utils names them; nothing is called)")
    import slime.utils.types as slime_types

    return slime_types


def _rollout_writer(root: Path):
    """`RolloutManager._save_debug_rollout_data`, as `rollout.py` writes it."""
    source = (root / "slime" / "ray" / "rollout.py").read_text()
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "_save_debug_rollout_data":
            module = ast.Module(body=[node], type_ignores=[])
            names = {"Path": Path, "torch": torch, "logger": logging.getLogger("slime.ray.rollout")}
            exec(compile(module, str(root / "slime" / "ray" / "rollout.py"), "exec"), names)
            return names["_save_debug_rollout_data"]
    raise SystemExit(f"{root}: no _save_debug_rollout_data in slime/ray/rollout.py")


def write_tree(root: Path, out: Path) -> dict[str, object]:
    slime_types = _import_tree(root)
    sample_cls = slime_types.Sample
    samples = []
    for index in (10, 11, 12, 13):
        ids = [f"slime-{index}"] + ([f"slime-{index}-1"] if index == 13 else [])
        samples.append(
            sample_cls(
                index=index,
                prompt=f"prompt {index}",
                tokens=[1, 2, 3, index],
                response="x",
                response_length=1,
                reward=1.0,
                status=sample_cls.Status.COMPLETED,
                metadata={"rlprobe_request_ids": ids},
            )
        )
    eval_samples = [sample_cls(index=i, prompt="eval", tokens=[1], status=sample_cls.Status.COMPLETED) for i in (0, 1)]
    writer = _rollout_writer(root)
    rollout_template = str(out / "rollout_data" / "{rollout_id}.pt")
    manager = SimpleNamespace(args=SimpleNamespace(save_debug_rollout_data=rollout_template))
    writer(manager, samples, rollout_id=3, evaluation=False)
    writer(manager, {"aime": {"samples": eval_samples}}, rollout_id=3, evaluation=True)

    from slime.utils import train_dump_utils

    train_template = str(out / "train_data" / "{rollout_id}_{rank}.pt")
    rollout_data = {
        "tokens": [torch.tensor(s.tokens) for s in samples],
        "total_lengths": [len(s.tokens) for s in samples],
        "response_lengths": [s.response_length for s in samples],
        "sample_indices": [s.index for s in samples],
        "rewards": [1.0] * len(samples),
    }
    train_dump_utils.save_debug_train_data(
        SimpleNamespace(save_debug_train_data=train_template), rollout_id=3, rollout_data=rollout_data
    )
    # derived: the single-file train dump of later slime (format_version 2), from its documented structure
    positions = {10: 0, 11: 1, 12: 2, 13: 3}
    v2 = {
        "format_version": 2,
        "rollout_id": 3,
        "rank": 0,
        "samples": [
            {"sample_index": s.index, "rollout_position": positions[s.index], "tokens": torch.tensor(s.tokens)}
            for s in sorted(samples, key=lambda s: positions[s.index])
        ],
        "dp_shards": [{"dp_rank": 0, "rollout_positions": [0, 2]}, {"dp_rank": 1, "rollout_positions": [1, 3]}],
    }
    (out / "train_data_v2").mkdir(parents=True, exist_ok=True)
    torch.save(v2, out / "train_data_v2" / "3.pt")
    sys.path.remove(str(root))
    return {"root": str(root), "files": sorted(str(p.relative_to(out)) for p in out.rglob("*.pt"))}


DP_SIZE = 2


def _perturbations(specs: list[str]) -> dict[int, dict[int | None, float]]:
    """`12=0.5` (every token of sample 12), `14@1=-0.3` (its token 1)."""
    out: dict[int, dict[int | None, float]] = {}
    for spec in specs:
        key, delta = spec.split("=")
        index, _, token = key.partition("@")
        out.setdefault(int(index), {})[int(token) if token else None] = float(delta)
    return out


def write_logprobs_tree(root: Path, out: Path, perturb: dict[int, dict[int | None, float]]) -> dict[str, object]:
    slime_types = _import_tree(root)
    sample_cls = slime_types.Sample
    samples = []
    for index in range(10, 16):
        length = 2 + index % 3
        response = [100 + 10 * index + k for k in range(length)]
        samples.append(
            sample_cls(
                index=index,
                prompt=f"prompt {index}",
                tokens=[1, 2, 3, *response],
                response="x" * length,
                response_length=length,
                reward=1.0,
                status=sample_cls.Status.COMPLETED,
                rollout_log_probs=[-(0.25 + 0.125 * k + 0.0625 * (index - 10)) for k in range(length)],
                metadata={"rlprobe_request_ids": [f"slime-{index}"]},
            )
        )
    eval_samples = [sample_cls(index=i, prompt="eval", tokens=[1], status=sample_cls.Status.COMPLETED) for i in (0, 1)]
    writer = _rollout_writer(root)
    manager = SimpleNamespace(
        args=SimpleNamespace(save_debug_rollout_data=str(out / "rollout_data" / "{rollout_id}.pt"))
    )
    writer(manager, samples, rollout_id=5, evaluation=False)
    writer(manager, {"aime": {"samples": eval_samples}}, rollout_id=5, evaluation=True)

    def training(sample) -> list[float]:  # type: ignore[no-untyped-def]
        offsets = perturb.get(sample.index, {})
        return [lp + offsets.get(k, offsets.get(None, 0.0)) for k, lp in enumerate(sample.rollout_log_probs)]

    from slime.utils import train_dump_utils

    args = SimpleNamespace(save_debug_train_data=str(out / "train_data" / "{rollout_id}_{rank}.pt"))
    get_rank = torch.distributed.get_rank
    try:
        for rank in range(DP_SIZE):
            share = [samples[i] for i in range(rank, len(samples), DP_SIZE)]
            rollout_data = {
                "tokens": [torch.tensor(s.tokens) for s in share],
                "total_lengths": [len(s.tokens) for s in share],
                "response_lengths": [s.response_length for s in share],
                "sample_indices": [s.index for s in share],
                "rewards": [s.reward for s in share],
                "rollout_log_probs": [torch.tensor(s.rollout_log_probs, dtype=torch.float32) for s in share],
                "log_probs": [torch.tensor(training(s), dtype=torch.float32) for s in share],
            }
            torch.distributed.get_rank = lambda *a, _rank=rank, **k: _rank  # type: ignore[misc]
            train_dump_utils.save_debug_train_data(args, rollout_id=5, rollout_data=rollout_data)
    finally:
        torch.distributed.get_rank = get_rank
    STANDINS.append("torch.distributed.get_rank: each data-parallel rank in turn, while slime's train writer runs")
    sys.path.remove(str(root))
    return {"root": str(root), "files": sorted(str(p.relative_to(out)) for p in out.rglob("*.pt"))}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--slime-root", type=Path, action="append", required=True)
    parser.add_argument("--out", type=Path, required=True, help="one folder per tree is made under it")
    parser.add_argument("--logprobs", action="store_true", help="the per-sample log-probs tree (issue 30)")
    parser.add_argument("--perturb", action="append", default=[], help="INDEX=DELTA or INDEX@TOKEN=DELTA")
    args = parser.parse_args()
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    trees = []
    for number, root in enumerate(args.slime_root):
        out = args.out / str(number)
        out.mkdir(parents=True, exist_ok=True)
        if args.logprobs:
            trees.append(write_logprobs_tree(root, out, _perturbations(args.perturb)))
        else:
            trees.append(write_tree(root, out))
    torch.distributed.destroy_process_group()
    print(json.dumps({"trees": trees, "standins": sorted(set(STANDINS))}))


if __name__ == "__main__":
    main()
