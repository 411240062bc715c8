"""What the inserted hooks cost per call when dumping is off, measured on their own.

    python bench/gpu/offpath_cost.py [--micro-batches 4] [--out r.json]

Run with the python whose `import verl` is a patched tree. It takes the real inserted methods
(`_should_dump`, `_ensure_debugger`) from the patched `FSDPEngine` and `MegatronEngine`
classes, binds them to a bare object in the state `__init__` leaves (debugger None, DUMP_ON
unset), and times with `timeit` exactly the statements the patch adds to one
`forward_backward_batch` call of `--micro-batches` micro-batches, minus the same loop with no
statements. An interleaved in-process GPU measurement resolves a few per cent at best when
steps jitter by tens of per cent; this gives the off-path cost in nanoseconds, to set against
a step's time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import timeit
import types
from pathlib import Path


def holder(cls, megatron: bool):
    obj = types.SimpleNamespace()
    obj.engine_config = types.SimpleNamespace(forward_only=False)
    obj._debugger = None
    obj._update_actor_logger_fp = None
    if megatron:
        obj._dump_should_record = False
        obj._dump_micro_batch = None
    # The decision's methods, and the switch reader's (`_rlprobe_*`, from issue 15 on) they call.
    for name in ("_ensure_debugger", "_should_dump", *(n for n in dir(cls) if n.startswith("_rlprobe_"))):
        setattr(obj, name, types.MethodType(getattr(cls, name), obj))
    return obj


def best_ns(stmt: str, env: dict, number: int, repeat: int) -> float:
    return min(timeit.repeat(stmt, globals=env, number=number, repeat=repeat)) / number * 1e9


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--micro-batches", type=int, default=4)
    p.add_argument("--number", type=int, default=20000)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    for switch in ("DUMP_ON", "DUMP_PHASE"):
        os.environ.pop(switch, None)

    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine
    from verl.workers.engine.megatron.transformer_impl import MegatronEngine

    n = args.micro_batches
    loop = f"for _ in range({n}):\n    pass\n"
    # FSDP: one decision before the loop, two `if` per micro-batch (start, finish)
    fsdp = (
        "dump_this_call = self._should_dump(forward_only)\n"
        f"for _ in range({n}):\n    if dump_this_call:\n        pass\n    if dump_this_call:\n        pass\n"
    )
    # Megatron: the decision, one `if` after the schedule, two per micro-batch (forward_step, loss)
    megatron = (
        "self._dump_should_record = self._should_dump(forward_only)\n"
        f"for _ in range({n}):\n    if self._dump_should_record:\n        pass\n"
        "    if self._dump_should_record:\n        pass\n"
        "if self._dump_should_record:\n    pass\n"
    )
    result = {"micro_batches": n, "python": sys.version.split()[0], "ns_per_forward_backward_batch": {}}
    for name, cls, stmt, mega in (("fsdp", FSDPEngine, fsdp, False), ("megatron", MegatronEngine, megatron, True)):
        if not hasattr(cls, "_should_dump"):
            raise SystemExit(f"{cls.__name__} has no _should_dump: run this with a patched tree")
        costs = {}
        for forward_only in (False, True):
            env = {"self": holder(cls, mega), "forward_only": forward_only}
            with_hooks = best_ns(stmt, env, args.number, args.repeat)
            bare = best_ns(loop, env, args.number, args.repeat)
            costs["log_prob" if forward_only else "train"] = round(with_hooks - bare, 1)
        result["ns_per_forward_backward_batch"][name] = costs
        print(f"{name}: off-path cost per forward_backward_batch call ({n} micro-batches): {costs} ns")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
