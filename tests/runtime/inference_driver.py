"""Run the inserted SGLang and vLLM-Ascend hooks with real msprobe on CPU torch.

Run it with the python of a runtime venv (torch + mindstudio-probe; see venvs.py)::

    python inference_driver.py sglang --patched-file .../model_runner.py --forwards 3 --out r.json
    python inference_driver.py dispatch --patched-file .../model_runner_v1.py \
        --logger-file .../dispatch_logger.py --out r.json

Real: the code exactly as `rlprobe-patch apply` wrote it into a real SGLang / vLLM-Ascend
file (taken out by syntax tree, never imported: those files need GPU/NPU stacks), the added
`dispatch_logger.py` module, msprobe's `PrecisionDebugger` writing its dumps, torch.
Stand-in: the runner objects around the hooks (`ModelRunner` with a `forward` that calls a
tiny model; `NPUModelRunner` steps driven with `scheduler_output` objects that carry new and
cached requests, the fields vLLM's `SchedulerOutput` has). The caller sets the msprobe
config environment (MSPROBE_SGLANG_CONFIG...); the dispatch run takes --config.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import logging
import os
import sys
import textwrap
import traceback
import types
from pathlib import Path

import torch

logger = logging.getLogger("rlprobe-standin")


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef:
    return next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name)


def _bind(cls: type, source_file: Path, methods: list[ast.FunctionDef], namespace: dict) -> None:
    """Execute the methods as written in `source_file` and attach them to `cls`."""
    for method in methods:
        scope: dict = {}
        exec(compile(ast.Module(body=[method], type_ignores=[]), str(source_file), "exec"), namespace, scope)
        setattr(cls, method.name, scope[method.name])


def _statements(stmts: list[ast.stmt]) -> str:
    return "\n".join(ast.unparse(s) for s in stmts)


class TinyModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(32, 8)
        self.proj = torch.nn.Linear(8, 32)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.proj(self.embed(input_ids))


# -- SGLang ModelRunner ---------------------------------------------------------------------------
def run_sglang(args: argparse.Namespace) -> dict:
    path = args.patched_file
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    runner = _class(tree, "ModelRunner")
    init, forward = _method(runner, "__init__"), _method(runner, "forward")
    created = init.body[0]  # the inserted first statement of __init__
    count = next(i for i, s in enumerate(forward.body) if isinstance(s, ast.AugAssign))
    start = forward.body[count + 1]  # the inserted statement after `self.forward_pass_id += 1`
    ret = next(i for i, s in enumerate(forward.body) if isinstance(s, ast.Return))
    finish = forward.body[ret - 1]  # the inserted statement before `return output`
    body = "\n".join(
        [
            "class StandInModelRunner:",
            "    def __init__(self, server_args, gpu_id):",
            textwrap.indent(_statements([created]), " " * 8),
            "        self.model = TinyModel()",
            "        self.gpu_id = gpu_id",
            "        self.dp_size = server_args.dp_size",
            "        self.forward_pass_id = 0",
            "",
            "    def forward(self, forward_batch):",
            "        self.forward_pass_id += 1",
            textwrap.indent(_statements([start]), " " * 8),
            "        output = self.model(forward_batch)",
            textwrap.indent(_statements([finish]), " " * 8),
            "        return output",
        ]
    )
    source = body + "\n"
    namespace = {"os": os, "logger": logger, "torch": torch, "TinyModel": TinyModel}
    exec(compile(source, f"<stand-in ModelRunner with statements from {path}>", "exec"), namespace)
    cls = namespace["StandInModelRunner"]
    # Every method the patch adds: the debugger's, and the shared switch reader's (`_rlprobe_*`).
    added = [
        fn
        for fn in runner.body
        if isinstance(fn, ast.FunctionDef) and fn.name.startswith(("_init_msprobe", "_msprobe_", "_rlprobe_"))
    ]
    _bind(cls, path, added, namespace)
    server_args = types.SimpleNamespace(dp_size=args.dp_size, disaggregation_mode=args.disaggregation_mode)
    model_runner = cls(server_args, gpu_id=args.gpu_id)
    outputs = [model_runner.forward(torch.tensor([[1, 2, 3, 4]])).sum().item() for _ in range(args.forwards)]
    return {
        "debugger": model_runner.msprobe_debugger is not None,
        "outputs": outputs,
        "inserted": [ast.unparse(s) for s in (created, start, finish)],
    }


# -- vLLM-Ascend NPUModelRunner ----------------------------------------------------------------
def scheduler_outputs() -> list[types.SimpleNamespace]:
    """Three engine steps: a prefill of two new requests, their decode, a new request joining."""

    def step(new: dict[str, int], cached: dict[str, int]) -> types.SimpleNamespace:
        tokens = {**new, **cached}
        return types.SimpleNamespace(
            scheduled_new_reqs=[
                types.SimpleNamespace(req_id=r, prompt_token_ids=list(range(n))) for r, n in new.items()
            ],
            scheduled_cached_reqs=types.SimpleNamespace(req_ids=list(cached)),
            num_scheduled_tokens=tokens,
            total_num_scheduled_tokens=sum(tokens.values()),
        )

    return [
        step({"req-a-0a1b2c3d": 5, "req-b-4e5f6a7b": 7}, {}),
        step({}, {"req-a-0a1b2c3d": 1, "req-b-4e5f6a7b": 1}),
        step({"req-c-8c9d0e1f": 4}, {"req-a-0a1b2c3d": 1, "req-b-4e5f6a7b": 1}),
    ]


class StepKeywordAdapter:
    """The real debugger, with a step() that takes the keywords newer msprobe releases take."""

    def __init__(self, debugger) -> None:
        self._debugger = debugger
        self.step_keywords: list[dict] = []

    def __getattr__(self, name: str):
        return getattr(self._debugger, name)

    def step(self, **kwargs) -> None:
        self.step_keywords.append(kwargs)
        self._debugger.step()


def run_dispatch(args: argparse.Namespace) -> dict:
    from msprobe.pytorch import PrecisionDebugger

    # The module rlprobe-patch added, importable under its real name for the inserted import.
    spec = importlib.util.spec_from_file_location("vllm_ascend.worker.dispatch_logger", args.logger_file)
    module = importlib.util.module_from_spec(spec)
    for name in ("vllm_ascend", "vllm_ascend.worker"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["vllm_ascend.worker.dispatch_logger"] = module
    spec.loader.exec_module(module)

    path = args.patched_file
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    runner = _class(tree, "NPUModelRunner")
    init = _method(runner, "__init__")
    created = init.body[-2:]  # the inserted end of __init__: `self._dispatch_logger = None` + `if ...`
    names = {n.name for n in runner.body if isinstance(n, ast.FunctionDef)}
    finalize = "_finalize_dump_data" in names
    methods = ["_finish_msprobe_step"] + (["_start_dump_data", "_finalize_dump_data"] if finalize else [])

    class StandInNPUModelRunner:
        def __init__(self, debugger) -> None:
            self.debugger = debugger
            self._debugger_started = False
            self.model = TinyModel()
            exec(compile(ast.Module(body=created, type_ignores=[]), str(path), "exec"), namespace, {"self": self})

    namespace = {"os": os, "torch": torch, "logger": logger}
    _bind(StandInNPUModelRunner, path, [_method(runner, m) for m in methods], namespace)
    if finalize:  # 0.20.2rc1+: the stash statement inserted after `self._start_dump_data()` in execute_model
        execute = _method(runner, "execute_model")
        stash = next(
            s for s in ast.walk(execute) if isinstance(s, ast.Assign) and "_dump_scheduler_output" in ast.unparse(s)
        )
    else:  # 0.12 to 0.19: the statement inserted before each `if ...: self.debugger.stop()` of sample_tokens
        sample = _method(runner, "sample_tokens")
        hook = next(s for s in ast.walk(sample) if isinstance(s, ast.Expr) and "_finish_msprobe_step" in ast.unparse(s))

    debugger = PrecisionDebugger(config_path=str(args.config))
    if finalize:
        # vLLM-Ascend 0.20+ calls debugger.step(dump=False) for dummy runs, a keyword that
        # mindstudio-probe 26.2.0's step() lacks (newer msprobe has it): accept and record it.
        debugger = StepKeywordAdapter(debugger)
    model_runner = StandInNPUModelRunner(debugger)
    for scheduler_output in scheduler_outputs():
        scope = {"self": model_runner, "scheduler_output": scheduler_output}
        if finalize:
            model_runner._start_dump_data()
            exec(compile(ast.Module(body=[stash], type_ignores=[]), str(path), "exec"), namespace, scope)
            model_runner.model(torch.tensor([[1, 2, 3]]))
            model_runner._finalize_dump_data()
        else:
            model_runner.debugger.start(model=model_runner.model)
            model_runner.model(torch.tensor([[1, 2, 3]]))
            exec(compile(ast.Module(body=[hook], type_ignores=[]), str(path), "exec"), namespace, scope)
            model_runner.debugger.stop()
            model_runner.debugger.step()
    if finalize:  # a dummy run (profiling, graph capture) passes dump=False: no log line for it
        model_runner._start_dump_data()
        model_runner._finalize_dump_data(dump=False)
    return {
        "layout": "finalize" if finalize else "inline",
        "log": model_runner._dispatch_logger.path,
        "step_keywords": getattr(debugger, "step_keywords", None),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["sglang", "dispatch"])
    parser.add_argument("--patched-file", type=Path, required=True)
    parser.add_argument("--logger-file", type=Path)
    parser.add_argument("--config", type=Path)
    parser.add_argument("--forwards", type=int, default=3)
    parser.add_argument("--dp-size", type=int, default=1)
    parser.add_argument("--gpu-id", type=int, default=0)
    parser.add_argument("--disaggregation-mode", default="null")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    try:
        result = {"sglang": run_sglang, "dispatch": run_dispatch}[args.what](args)
        result["ok"] = True
    except Exception:
        result = {"ok": False, "error": traceback.format_exc()}
    args.out.write_text(json.dumps(result, indent=2, default=str))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
