"""Write slime's debug dumps with slime's own writers, from unpacked release trees, on the CPU.

Run it with a python that has torch (the megatron venv), not pytest's::

    <venv>/bin/python tests/runtime/slime_debug_writer.py --slime-root <tree> --out <dir> [--slime-root ...]

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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--slime-root", type=Path, action="append", required=True)
    parser.add_argument("--out", type=Path, required=True, help="one folder per tree is made under it")
    args = parser.parse_args()
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    trees = []
    for number, root in enumerate(args.slime_root):
        out = args.out / str(number)
        out.mkdir(parents=True, exist_ok=True)
        trees.append(write_tree(root, out))
    torch.distributed.destroy_process_group()
    print(json.dumps({"trees": trees, "standins": sorted(set(STANDINS))}))


if __name__ == "__main__":
    main()
