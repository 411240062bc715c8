"""Run the real, patched `ModelRunner.forward` of an SGLang release with real msprobe on CPU torch.

Run it with the python of a runtime venv (torch + mindstudio-probe; see venvs.py)::

    python sglang_forward_driver.py --patched-file .../model_runner.py \
        --logger-file .../dispatch_logger.py --config cfg.json --out r.json

Real: `ModelRunner.forward` exactly as it stands in the patched file (SGLang's own code and
the statements rlprobe-patch inserted, executed from that file's syntax tree), the
`dispatch_logger.py` module rlprobe-patch added (imported under its real name), msprobe's
`PrecisionDebugger` (SGLang's own from 0.5.11, created as its `init_msprobe` does; below 0.5.11
by the `_init_msprobe_debugger` that sglang.model-runner inserted), torch.

Stand-in (SGLang's import chain needs triton and CUDA kernels): the `ModelRunner` object the
method runs on (`_forward_raw` calls a tiny torch model), the `ForwardBatch` objects (our own
dataclass with the fields the logger reads: `forward_mode`, `rids`, `extend_seq_lens_cpu`,
`extend_prefix_lens_cpu`, `seq_lens_cpu`, `batch_size`), and the module-level helpers
`forward` calls (expert-distribution recorder, dumper, span names), which do nothing here.

Below SGLang 0.5.8 (`--scheduler-file`, `--forward-batch-file`), each batch's rids come from the
two statements sglang.dispatch-logger inserted into `Scheduler.run_batch` and
`ForwardBatch.init_new`, executed as written (see `rids_via_scheduler`).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import logging
import os
import sys
import traceback
import types
from dataclasses import dataclass, field
from pathlib import Path

import torch

# The stand-ins ship with rlprobe-patch (the consistency demo runs ModelRunner.forward too).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src" / "rlprobe_patch" / "demo" / "drivers"))
from sglang_standins import ForwardMode, Inert, free_names, load_logger_module

logger = logging.getLogger("rlprobe-standin")


@dataclass
class StandInForwardBatch:
    forward_mode: ForwardMode
    input_ids: torch.Tensor
    rids: list[str] | None
    seq_lens_cpu: torch.Tensor
    extend_seq_lens_cpu: list[int] | None = None
    extend_prefix_lens_cpu: list[int] | None = None
    batch_size: int = field(init=False)

    def __post_init__(self) -> None:
        self.batch_size = len(self.seq_lens_cpu)

    def apply_deprecated_skip_attn_backend_init(self, value: object) -> None:  # 0.5.23 calls it
        pass


def batches(with_rids: bool, names: list[str]) -> list[StandInForwardBatch]:
    """Eight passes: two single-request prefills (a, b), their decode, a batched prefill (c, d),
    an idle pass (data-parallel padding), a prefill that reused two cached prefix tokens (e),
    and a prompt prefilled in two chunks (f)."""
    a, b, c, d, e, f = names

    def fb(mode: ForwardMode, rids: list[str], extend: list[int] | None, prefix: list[int] | None, seq: list[int]):
        tokens = sum(extend) if extend else max(len(seq), 1)
        return StandInForwardBatch(
            mode,
            torch.arange(tokens) % 32,
            rids if with_rids else None,
            torch.tensor(seq, dtype=torch.int64),
            extend,
            prefix,
        )

    return [
        fb(ForwardMode.EXTEND, [a], [4], [0], [4]),
        fb(ForwardMode.EXTEND, [b], [5], [0], [5]),
        fb(ForwardMode.DECODE, [a, b], None, None, [5, 6]),
        fb(ForwardMode.EXTEND, [c, d], [3, 6], [0, 0], [3, 6]),
        fb(ForwardMode.IDLE, [], None, None, []),
        fb(ForwardMode.EXTEND, [e], [3], [2], [5]),
        fb(ForwardMode.EXTEND, [f], [2], [0], [2]),
        fb(ForwardMode.EXTEND, [f], [3], [2], [5]),
    ]


class TinyModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(32, 8)
        self.proj = torch.nn.Linear(8, 32)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.proj(self.embed(input_ids))


def _method(tree: ast.Module, cls: str, name: str) -> ast.FunctionDef | None:
    runner = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    return next((n for n in runner.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def inserted_rids_statement(path: Path, cls: str, method: str) -> ast.stmt:
    """The one `<name>.rids = ...` statement sglang.dispatch-logger inserted into `cls.method` of `path`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    fn = _method(tree, cls, method)
    assert fn is not None, f"{path}: no {cls}.{method}"
    found = [
        node
        for node in ast.walk(fn)
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Attribute)
        and node.targets[0].attr == "rids"
        and isinstance(node.targets[0].value, ast.Name)
    ]
    assert len(found) == 1, f"{path}: {cls}.{method} has {len(found)} `*.rids = ...` statements"
    return found[0]


def rids_via_scheduler(args: argparse.Namespace, forward_batches: list[StandInForwardBatch]) -> list[str]:
    """SGLang before 0.5.8: each ForwardBatch's rids as the two inserted statements carry them, run as
    written: `Scheduler.run_batch` puts the scheduler batch's rids on the ModelWorkerBatch it built,
    `ForwardBatch.init_new` copies them. Stand-ins: the scheduler batch and its requests (objects with
    `reqs` and `rid`), the ModelWorkerBatch (an empty object), the rest of both methods."""
    put = inserted_rids_statement(args.scheduler_file, "Scheduler", "run_batch")
    keep = inserted_rids_statement(args.forward_batch_file, "ForwardBatch", "init_new")
    worker_name = put.targets[0].value.id  # model_worker_batch, or batch_or_worker_batch (0.5.3)
    put_code = compile(ast.Module(body=[put], type_ignores=[]), str(args.scheduler_file), "exec")
    keep_code = compile(ast.Module(body=[keep], type_ignores=[]), str(args.forward_batch_file), "exec")
    for fb in forward_batches:
        reqs = [types.SimpleNamespace(rid=rid) for rid in fb.rids or []]
        worker_batch = types.SimpleNamespace()
        exec(put_code, {worker_name: worker_batch, "batch": types.SimpleNamespace(reqs=reqs)})
        fb.rids = None  # what init_new's `ret = cls(...)` gives on these releases: no rids
        exec(keep_code, {"batch": worker_batch, "ret": fb, "getattr": getattr})
    return [ast.unparse(put), ast.unparse(keep)]


def run(args: argparse.Namespace) -> dict:
    if args.logger_file:
        load_logger_module(args.logger_file)
    path = args.patched_file
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    forward = _method(tree, "ModelRunner", "forward")
    init_debugger = _method(tree, "ModelRunner", "_init_msprobe_debugger")  # sglang.model-runner's
    rank_id = _method(tree, "ModelRunner", "_msprobe_rank_id")
    assert forward is not None
    namespace: dict = {"torch": torch, "contextlib": contextlib, "logging": logging, "os": os, "logger": logger}
    for name in free_names(forward) - set(namespace):
        namespace[name] = Inert()
    if "ElasticEPStateManager" in namespace:  # 0.5.10: no elastic expert parallelism, no rebalance
        namespace["ElasticEPStateManager"] = types.SimpleNamespace(instance=lambda: None)

    class StandInModelRunner:
        def __init__(self) -> None:
            self.model = TinyModel()
            self.forward_pass_id = 0
            self.gpu_id = args.gpu_id
            self.tp_rank = 0
            self.dp_size = args.dp_size
            self.server_args = types.SimpleNamespace(
                dp_size=args.dp_size,
                disaggregation_mode=args.disaggregation_mode,
                disable_overlap_schedule=True,
                elastic_ep_backend=None,
            )
            self.eplb_manager = None
            self.enable_elastic_ep = False
            self.graph_runner = self.decode_cuda_graph_runner = None
            self.is_draft_worker = False
            self.canary_manager = None

        def _elastic_cuda_graph_enabled(self) -> bool:  # 0.5.23
            return False

        def maybe_join_ep_ranks(self) -> None:  # 0.5.23, elastic expert parallelism
            pass

        def maybe_recover_ep_ranks(self) -> None:  # 0.5.11
            pass

        def _forward_raw(self, forward_batch: StandInForwardBatch, *args: object) -> types.SimpleNamespace:
            return types.SimpleNamespace(logits=self.model(forward_batch.input_ids), can_run_graph=False)

    # Every method sglang.model-runner adds besides: the switch reader and the config path it reads.
    model_runner = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelRunner")
    reader = [
        fn
        for fn in model_runner.body
        if isinstance(fn, ast.FunctionDef) and fn.name.startswith(("_rlprobe_", "_msprobe_config"))
    ]
    methods = [forward] + [m for m in (init_debugger, rank_id) if m is not None] + reader
    for method in methods:
        scope: dict = {}
        exec(compile(ast.Module(body=[method], type_ignores=[]), str(path), "exec"), namespace, scope)
        setattr(StandInModelRunner, method.name, scope[method.name])

    runner = StandInModelRunner()
    if init_debugger is not None:
        runner._init_msprobe_debugger(runner.server_args)  # reads MSPROBE_SGLANG_CONFIG (set by the caller)
    elif args.config:  # SGLang 0.5.11+: init_msprobe, with --msprobe-dump-config
        from msprobe.pytorch import PrecisionDebugger

        runner.msprobe_debugger = PrecisionDebugger(config_path=str(args.config))
    else:
        runner.msprobe_debugger = None
    forward_batches = batches(not args.no_rids, args.rids.split(","))
    inserted = rids_via_scheduler(args, forward_batches) if args.scheduler_file else []
    sums = [runner.forward(fb).logits.sum().item() for fb in forward_batches]
    return {
        "debugger": runner.msprobe_debugger is not None,
        "outputs": sums,
        "free_names": sorted(free_names(forward)),
        "rids_statements": inserted,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patched-file", type=Path, required=True)
    parser.add_argument("--logger-file", type=Path)
    parser.add_argument("--config", type=Path, help="SGLang 0.5.11+: the --msprobe-dump-config file")
    parser.add_argument("--no-rids", action="store_true", help="ForwardBatch without rids (SGLang < 0.5.10)")
    parser.add_argument(
        "--scheduler-file", type=Path, help="SGLang < 0.5.8: the patched scheduler.py (rids put on the worker batch)"
    )
    parser.add_argument(
        "--forward-batch-file", type=Path, help="SGLang < 0.5.8: the patched forward_batch_info.py (rids kept)"
    )
    parser.add_argument("--rids", default="rid-a,rid-b,rid-c,rid-d,rid-e,rid-f", help="the six request ids")
    parser.add_argument("--dp-size", type=int, default=1)
    parser.add_argument("--gpu-id", type=int, default=0)
    parser.add_argument("--disaggregation-mode", default="null")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    try:
        result = run(args)
        result["ok"] = True
    except Exception:
        result = {"ok": False, "error": traceback.format_exc()}
    args.out.write_text(json.dumps(result, indent=2, default=str))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
