"""Run the legacy-worker dump hooks of a patched verl release on the CPU, with the real msprobe.

Run it with a venv's python, not pytest's (``tests/runtime/test_legacy_workers_runtime.py`` does)::

    <verl-0.7.1 venv>/bin/python tests/runtime/legacy_driver.py fsdp --out result.json
    <megatron venv>/bin/python tests/runtime/legacy_driver.py megatron \\
        --patched-file <tree>/verl/workers/actor/megatron_actor.py --out result.json

The driver never sets msprobe's switches (DUMP_ON, DUMP_PHASE, MSPROBE_ACTOR_CONFIG,
PROMPTS_ONLY): the test sets them in the environment. Each run makes one log-prob call and
then one update call (``--micro-batches`` micro-batches each) and writes JSON to ``--out``:
the numbers (log-probs, losses, grad norm, a parameter checksum), the msprobe steps found
under the dump path, the ``update_actor_log.jsonl`` lines, and the event order.

``fsdp``: everything is verl's own code except the model. verl's real, patched
``DataParallelPPOActor`` (imported from the venv where ``rlprobe-patch apply --python`` patched
it), built with verl's real ``FSDPActorConfig``, drives ``compute_log_prob`` and
``update_policy`` on real ``DataProto`` batches (with ``request_id`` in the non-tensor part,
as the agent loop leaves it); a one-process gloo group stands for the data-parallel world.
The stand-in is the model: a tiny causal LM (embedding + linear) with the Hugging Face
calling convention (``input_ids``, ``attention_mask``, ``position_ids``, ``use_cache`` ->
``.logits``), not wrapped in FSDP (``DataParallelPPOActor`` accepts a plain module).

``megatron``: the hook code exactly as written into a real ``megatron_actor.py``, run by
megatron-core 0.16.1's own ``get_forward_backward_func()`` schedule (PP=1, gloo). The patched
file is parsed with ``ast``, never imported (it needs verl and GPU-only megatron pieces): the
methods ``rlprobe-patch`` added to ``MegatronPPOActor`` and the statements it inserted (the end
of ``__init__``, the start of ``compute_log_prob`` and ``forward_backward_batch``, after each
``losses_reduced = forward_backward_func(...)``, after ``batch = next(batch_iter)`` in the nested
``forward_step``, before each ``return`` of the nested ``loss_func``) are executed as written,
inside a stand-in ``MegatronPPOActor`` with verl's control flow (nested ``forward_step`` and
``loss_func`` closures handed to the schedule) around a two-layer MLP.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import glob
import json
import os
import sys
import textwrap
import traceback
from pathlib import Path

# ---------------------------------------------------------------------------- shared


def dump_path_from_env() -> str | None:
    config = os.environ.get("MSPROBE_ACTOR_CONFIG")
    if not config or not Path(config).is_file():
        return None
    return json.loads(Path(config).read_text()).get("dump_path")


def collect_dump(dump_path: str | None) -> dict:
    """msprobe's steps (``step<N>/rank<R>/dump.json``) and our ``<pid>/update_actor_log.jsonl`` lines."""
    if not dump_path or not Path(dump_path).exists():
        return {"steps": [], "log_lines": [], "files": 0}
    steps = {}
    for path in glob.glob(os.path.join(dump_path, "**", "dump.json"), recursive=True):
        parts = Path(path).relative_to(dump_path).parts
        step = next((p for p in parts if p.startswith("step")), None)
        data = json.loads(Path(path).read_text()).get("data", {})
        steps.setdefault(step, []).append({"path": path, "keys": len(data), "backward_keys": _backward(data)})
    lines = []
    for path in glob.glob(os.path.join(dump_path, "*", "update_actor_log.jsonl")):
        lines += [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    files = sum(1 for _ in Path(dump_path).rglob("*") if _.is_file())
    ordered = sorted(steps, key=lambda s: int(s[4:]))
    return {"steps": [{"step": s, "dumps": steps[s]} for s in ordered], "log_lines": lines, "files": files}


def _backward(data: dict) -> int:
    return sum(1 for key in data if ".backward" in key)


def wrap_debugger(events: list) -> None:
    """Record PrecisionDebugger.start/stop/step calls (observation only)."""
    from msprobe.pytorch import PrecisionDebugger

    for name in ("start", "stop", "step"):
        orig = getattr(PrecisionDebugger, name).__func__

        def wrapper(cls, *a, __orig=orig, __name=name, **k):
            events.append(f"debugger.{__name}")
            return __orig(cls, *a, **k)

        setattr(PrecisionDebugger, name, classmethod(wrapper))


def init_gloo(workdir: Path):
    import torch.distributed as dist

    store = workdir / f".pg_store_{os.getpid()}"
    if store.exists():
        store.unlink()
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    return dist


# ---------------------------------------------------------------------------- fsdp (real verl)


def run_fsdp(args: argparse.Namespace, result: dict) -> None:
    import types

    import numpy as np
    import torch
    import verl
    from verl import DataProto
    from verl.workers.actor import dp_actor
    from verl.workers.config import FSDPActorConfig, FSDPEngineConfig

    result["real"] = {"verl": verl.__version__, "dp_actor": dp_actor.__file__, "msprobe": "mindstudio-probe"}
    Actor = dp_actor.DataParallelPPOActor
    result["patched"] = hasattr(Actor, "_ensure_debugger")
    workdir = Path(args.out).resolve().parent
    dist = init_gloo(workdir)
    events: list[str] = []
    if os.environ.get("DUMP_ON"):
        wrap_debugger(events)
    try:
        torch.manual_seed(args.seed)
        vocab, hidden, prompt_len, response_len = 32, 16, 5, 3
        seen_seq_lens: list[int] = []

        class TinyCausalLM(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = torch.nn.Embedding(vocab, hidden)
                self.head = torch.nn.Linear(hidden, vocab)

            def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False, **kwargs):
                seen_seq_lens.append(int(input_ids.shape[-1]))
                events.append("model.forward")
                hidden_states = torch.tanh(self.embed(input_ids)).cumsum(dim=1)
                return types.SimpleNamespace(logits=self.head(hidden_states))

        model = TinyCausalLM()
        for p in model.parameters():
            p.register_post_accumulate_grad_hook(lambda _p: events.append("model.grad"))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        n = args.micro_batches * args.micro_batch_size
        config = FSDPActorConfig(
            strategy="fsdp",
            ppo_mini_batch_size=n,
            ppo_micro_batch_size_per_gpu=args.micro_batch_size,
            use_dynamic_bsz=False,
            ppo_max_token_len_per_gpu=1024,
            rollout_n=1,
            use_torch_compile=False,
            fsdp_config=FSDPEngineConfig(dtype="float32"),
        )
        actor = Actor(config=config, actor_module=model, actor_optimizer=optimizer)

        seq = prompt_len + response_len
        input_ids = torch.randint(0, vocab, (n, seq))
        batch = {
            "input_ids": input_ids,
            "attention_mask": torch.ones(n, seq, dtype=torch.int64),
            "position_ids": torch.arange(seq).expand(n, seq).clone(),
            "responses": input_ids[:, prompt_len:].clone(),
            "response_mask": torch.ones(n, response_len, dtype=torch.int64),
            "old_log_probs": torch.zeros(n, response_len),
            "advantages": torch.randn(n, response_len),
        }
        request_ids = np.array([f"req-{i}" for i in range(n)], dtype=object)
        meta = {"micro_batch_size": args.micro_batch_size, "temperature": 1.0, "use_dynamic_bsz": False}

        def make_data():
            return DataProto.from_dict(
                tensors={k: v.clone() for k, v in batch.items()},
                non_tensors={"request_id": request_ids.copy()},
                meta_info=dict(meta),
            )

        events.append("call.compute_log_prob")
        out = actor.compute_log_prob(make_data(), calculate_entropy=False)
        log_probs = out["log_probs"] if isinstance(out, dict) else out[0]
        result["log_probs"] = log_probs.tolist()
        result["log_probs_shape"] = list(log_probs.shape)
        result["log_prob_seq_lens"] = list(seen_seq_lens)
        events.append("call.update_policy")
        metrics = actor.update_policy(make_data())
        result["metrics"] = {
            k: (v if isinstance(v, (int, float)) else [float(x) for x in v]) for k, v in sorted(metrics.items())
        }
        result["param_checksum"] = float(sum(p.detach().double().sum() for p in model.parameters()))
        result["expected_request_ids"] = [
            [str(r) for r in request_ids[i : i + args.micro_batch_size]] for i in range(0, n, args.micro_batch_size)
        ]
    finally:
        dist.destroy_process_group()
    result["events"] = events
    result["dump"] = collect_dump(dump_path_from_env())


# ---------------------------------------------------------------------------- megatron (hooks from the file)

CLS = "MegatronPPOActor"
PAYLOAD = Path(__file__).resolve().parents[2] / "patches" / "verl.legacy-megatron-workers" / "payload.py"
GUARD = "_dump_should_record"


class ExtractError(Exception):
    """The patched file lacks a piece the driver needs."""


def _source(lines: list[str], node: ast.AST) -> str:
    return textwrap.dedent("".join(lines[node.lineno - 1 : node.end_lineno]))


def _indent(src: str, spaces: int) -> str:
    return textwrap.indent(src, " " * spaces)


def _is_guard(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.If)
        and isinstance(node.test, ast.Attribute)
        and node.test.attr == GUARD
        and isinstance(node.test.value, ast.Name)
        and node.test.value.id == "self"
    )


def _bodies(node: ast.AST):
    for field in ("body", "orelse"):
        stmts = getattr(node, field, None)
        if isinstance(stmts, list) and stmts and isinstance(stmts[0], ast.stmt):
            yield stmts
            for stmt in stmts:
                if not isinstance(stmt, (ast.FunctionDef, ast.ClassDef)):
                    yield from _bodies(stmt)


def _after(fn: ast.FunctionDef, is_anchor) -> list[ast.stmt]:
    return [b[i + 1] for b in _bodies(fn) for i, s in enumerate(b[:-1]) if is_anchor(s) and _is_guard(b[i + 1])]


def extract_megatron_hooks(path: Path) -> dict:
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    tree = ast.parse(text)
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == CLS), None)
    if cls is None:
        raise ExtractError(f"class {CLS} not found")
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    payload = ast.parse(PAYLOAD.read_text())
    ours = next(n for n in payload.body if isinstance(n, ast.ClassDef) and n.name == CLS)
    # Its own methods, and those it takes from patches/_shared/ (`name = Part.name`).
    names = [n.name for n in ours.body if isinstance(n, ast.FunctionDef)]
    names += [n.targets[0].id for n in ours.body if isinstance(n, ast.Assign)]
    missing = [name for name in names if name not in methods]
    if missing:
        raise ExtractError(f"{CLS} lacks the added methods {missing}")
    added = {name: _source(lines, methods[name]) for name in names}
    init_hook = next(n for n in payload.body if isinstance(n, ast.FunctionDef) and n.name == "init_debugger_state")
    init_stmts = methods["__init__"].body[-(len(init_hook.body) - 1) :]  # the payload's body minus its docstring
    if [ast.unparse(s) for s in init_stmts] != [ast.unparse(s) for s in init_hook.body[1:]]:
        raise ExtractError("__init__ does not end with the inserted debugger state")
    fbb = methods["forward_backward_batch"]
    first = fbb.body[1] if isinstance(fbb.body[0], ast.Expr) else fbb.body[0]
    clp = methods["compute_log_prob"]
    clp_first = clp.body[1] if isinstance(clp.body[0], ast.Expr) else clp.body[0]
    nested = {n.name: n for n in ast.walk(fbb) if isinstance(n, ast.FunctionDef) and n is not fbb}
    close = _after(fbb, lambda s: isinstance(s, ast.Assign) and "forward_backward_func(" in ast.unparse(s.value))
    start = _after(nested["forward_step"], lambda s: ast.unparse(s) == "batch = next(batch_iter)")
    loss_guards = {}
    for body in _bodies(nested["loss_func"]):
        for i, stmt in enumerate(body[1:], 1):
            if isinstance(stmt, ast.Return) and _is_guard(body[i - 1]):
                loss_guards[ast.unparse(stmt.value.elts[0])] = _source(lines, body[i - 1])
    if not (close and start and len(loss_guards) == 2 and "_prompts_only_batch" in ast.unparse(clp_first)):
        raise ExtractError(f"hooks missing: close={len(close)} start={len(start)} loss={list(loss_guards)}")
    return {
        "methods": added,
        "init": "".join(_source(lines, s) for s in init_stmts),
        "log_prob_prologue": _source(lines, clp_first),
        "decide": _source(lines, first),
        "close": _source(lines, close[0]),
        "start": _source(lines, start[0]),
        "loss_const": loss_guards.pop("torch.tensor(1.0, device=device)"),
        "loss_policy": loss_guards.pop("policy_loss"),
    }


STANDIN = '''
class StandInActor:
    """verl's MegatronPPOActor control flow around the hooks, with a stand-in model."""

    def __init__(self, module, optimizer):
        self.actor_module = [module]
        self.actor_optimizer = optimizer
@@INIT@@
    def compute_log_prob(self, data, calculate_entropy=False):
@@LOG_PROB_PROLOGUE@@
        with torch.no_grad():
            return self.forward_backward_batch(data, forward_only=True, micro_batch_size=MICRO_BATCH_SIZE)

    def update_policy(self, data):
        self.actor_optimizer.zero_grad()
        out = self.forward_backward_batch(data, forward_only=False, micro_batch_size=MICRO_BATCH_SIZE)
        self.actor_optimizer.step()
        return out

    def forward_backward_batch(self, data, forward_only=False, micro_batch_size=None):
@@DECIDE@@
        micro_batches = data.batch.split(micro_batch_size)
        forward_backward_func = get_forward_backward_func()

        def loss_func(output, data, meta_info):
            device = output.device
            metrics = {}
            if forward_only:
                if not calculate_entropy:
@@LOSS_CONST@@
                    return torch.tensor(1.0, device=device), metrics
            policy_loss = torch.nn.functional.mse_loss(output, data["labels"])
            EVENTS.append("loss")
@@LOSS_POLICY@@
            return policy_loss, [metrics, None]

        def forward_step(batch_iter, model):
            batch = next(batch_iter)
            EVENTS.append("batch_taken")
@@START@@
            output = model(batch["input_ids"])
            return output, partial(loss_func, data=batch, meta_info=None)

        calculate_entropy = False
        losses_reduced = forward_backward_func(
            forward_step_func=forward_step,
            data_iterator=iter(micro_batches),
            model=self.actor_module,
            num_microbatches=len(micro_batches),
            seq_length=1,
            micro_batch_size=1,
            forward_only=forward_only,
        )
@@CLOSE@@
        return losses_reduced
'''


def build_standin(ex: dict) -> str:
    src = STANDIN
    for key, spaces in (
        ("INIT", 8),
        ("LOG_PROB_PROLOGUE", 8),
        ("DECIDE", 8),
        ("LOSS_CONST", 20),
        ("LOSS_POLICY", 12),
        ("START", 12),
        ("CLOSE", 8),
    ):
        src = src.replace(f"@@{key}@@\n", _indent(ex[key.lower()], spaces))
    methods = "".join("\n" + _indent(code, 4) for code in ex["methods"].values())
    return src + methods


def run_megatron(args: argparse.Namespace, result: dict) -> None:
    import logging
    from functools import partial

    import torch
    from megatron.core import parallel_state as mpu
    from megatron.core.enums import ModelType
    from megatron.core.pipeline_parallel import get_forward_backward_func, schedules
    from megatron.core.transformer.transformer_config import TransformerConfig
    from tensordict import TensorDict

    ex = extract_megatron_hooks(Path(args.patched_file))
    result["extracted"] = {k: (sorted(v) if isinstance(v, dict) else v) for k, v in ex.items()}
    workdir = Path(args.out).resolve().parent
    dist = init_gloo(workdir)
    events: list[str] = []
    if os.environ.get("DUMP_ON"):
        wrap_debugger(events)
    try:
        mpu.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)

        class _CpuTorch:
            # forward_backward_no_pipelining allocates one counter on device="cuda".
            def __getattr__(self, name):
                return getattr(torch, name)

            @staticmethod
            def zeros(*a, **k):
                if str(k.get("device", "")).startswith("cuda"):
                    k["device"] = "cpu"
                return torch.zeros(*a, **k)

        if schedules.torch is torch:
            schedules.torch = _CpuTorch()
        result["workarounds"] = ["megatron-core schedules: torch.zeros(device='cuda') -> cpu"]

        torch.manual_seed(args.seed)
        tf_config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1)

        class TinyModel(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.config = tf_config
                self.model_type = ModelType.encoder_or_decoder
                self.fc1 = torch.nn.Linear(4, 8)
                self.fc2 = torch.nn.Linear(8, 1)

            def set_input_tensor(self, input_tensor):
                self.input_tensor = input_tensor

            def forward(self, x):
                events.append("model.forward")
                return self.fc2(torch.tanh(self.fc1(x)))

        class Wrapper(torch.nn.Module):
            """Stands for megatron's DDP / Float16Module wrappers, which `_start_dump_step` unwraps."""

            def __init__(self, module):
                super().__init__()
                self.module = module
                self.config = module.config
                self.model_type = module.model_type

            def set_input_tensor(self, input_tensor):
                self.module.set_input_tensor(input_tensor)

            def forward(self, x):
                return self.module(x)

        inner = TinyModel()
        for p in inner.parameters():
            p.register_post_accumulate_grad_hook(lambda _p: events.append("model.grad"))
        model = Wrapper(inner)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

        n = args.micro_batches * args.micro_batch_size
        x, y = torch.randn(n, 4), torch.randn(n, 1)

        class Data:
            """The part of DataProto the hooks and the stand-in touch."""

            def __init__(self):
                self.batch = TensorDict({"input_ids": x.clone(), "labels": y.clone()}, batch_size=[n])
                self.non_tensor_batch = {}
                self.meta_info = {}

        logger = logging.getLogger(str(args.patched_file))
        namespace = {
            "__name__": "rlprobe_legacy_standin",
            "torch": torch,
            "os": os,
            "logger": logger,
            "partial": partial,
            "get_forward_backward_func": get_forward_backward_func,
            "MICRO_BATCH_SIZE": args.micro_batch_size,
            "EVENTS": events,
        }
        exec(compile(build_standin(ex), f"<stand-in around hooks from {args.patched_file}>", "exec"), namespace)
        actor = namespace["StandInActor"](model, optimizer)

        events.append("call.compute_log_prob")
        log_prob_out = actor.compute_log_prob(Data())
        events.append("call.update_policy")
        update_out = actor.update_policy(Data())
        result["losses"] = {"log_prob": len(log_prob_out), "update": len(update_out)}
        result["param_checksum"] = float(sum(p.detach().double().sum() for p in model.parameters()))
        result["open_step"] = actor._dump_micro_batch is not None
    finally:
        dist.destroy_process_group()
    result["events"] = events
    result["dump"] = collect_dump(dump_path_from_env())


def run_megatron_pp(args: argparse.Namespace, result: dict) -> None:
    """``--pp`` / ``--vpp``: the same hooks, one process per pipeline stage, through megatron-core's
    1F1B (``forward_backward_pipelining_without_interleaving``) or interleaved schedule. The model
    chunks, the CPU workaround for p2p and the per-step summary are ``megatron_driver``'s."""
    import logging
    from functools import partial

    import megatron_driver as md
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as mpu
    from megatron.core.enums import ModelType
    from megatron.core.pipeline_parallel import get_forward_backward_func, schedules
    from megatron.core.transformer.transformer_config import TransformerConfig
    from tensordict import TensorDict

    ex = extract_megatron_hooks(Path(args.patched_file))
    result["extracted"] = {k: (sorted(v) if isinstance(v, dict) else v) for k, v in ex.items()}
    dist.init_process_group(
        "gloo", init_method=f"file://{args.store}", rank=args.rank, world_size=args.world_size, timeout=md.PG_TIMEOUT
    )
    R = md.Recorder()
    R.chunk = None
    try:
        mpu.initialize_model_parallel(
            tensor_model_parallel_size=1,
            pipeline_model_parallel_size=args.pp,
            virtual_pipeline_model_parallel_size=args.vpp if args.vpp > 1 else None,
        )
        if os.environ.get("DUMP_ON"):
            from msprobe.pytorch import PrecisionDebugger

            for name in ("start", "stop", "step"):
                orig = getattr(PrecisionDebugger, name).__func__

                def wrapper(cls, *a, __orig=orig, __name=name, **k):
                    service = getattr(cls._instance, "service", None)
                    R.rec(f"debugger.{__name}", current_iter=getattr(service, "current_iter", None))
                    return __orig(cls, *a, **k)

                setattr(PrecisionDebugger, name, classmethod(wrapper))

        class _CpuTorch:
            def __getattr__(self, name):
                return getattr(torch, name)

            @staticmethod
            def zeros(*a, **k):
                if str(k.get("device", "")).startswith("cuda"):
                    k["device"] = "cpu"
                return torch.zeros(*a, **k)

        if schedules.torch is torch:
            schedules.torch = _CpuTorch()
        result["workarounds"] = [
            "megatron-core schedules: torch.zeros(device='cuda') -> cpu",
            *md.cpu_p2p_workaround(torch),
        ]

        torch.manual_seed(args.seed)
        tf_config = TransformerConfig(
            num_layers=args.pp * args.vpp,
            hidden_size=8,
            num_attention_heads=1,
            pipeline_model_parallel_size=args.pp,
            virtual_pipeline_model_parallel_size=args.vpp if args.vpp > 1 else None,
            pipeline_dtype=torch.float32,
            variable_seq_lengths=True,
            moe_token_dispatcher_type="alltoall",
        )
        chunks = md.build_chunks(torch, tf_config, ModelType.encoder_or_decoder, args, R)

        class Wrapper(torch.nn.Module):
            """Stands for megatron's DDP / Float16Module wrappers, which `_start_dump_step` unwraps."""

            def __init__(self, module):
                super().__init__()
                self.module = module
                self.config = module.config
                self.model_type = module.model_type

            def set_input_tensor(self, input_tensor):
                self.module.set_input_tensor(input_tensor)

            def forward(self, x):
                return self.module(x)

        wrapped = [Wrapper(c) for c in chunks]
        params = torch.nn.ModuleList(chunks).parameters()
        optimizer = torch.optim.SGD(params, lr=0.1)

        class Iter:
            def __init__(self, items, chunk):
                self._items, self._pos, self._chunk = list(items), 0, chunk

            def __iter__(self):
                return self

            def __next__(self):
                if self._pos >= len(self._items):
                    raise StopIteration
                R.mb, R.chunk = self._pos, self._chunk
                self._pos += 1
                R.rec("batch_taken")
                return self._items[self._pos - 1]

        def make_batch_generator(batches, vpp_size):
            if vpp_size > 1:
                return [Iter(batches, c) for c in range(vpp_size)]
            return Iter(batches, 0)

        class Events:
            def append(self, name):
                R.rec(name)

        n = args.micro_batches * args.micro_batch_size
        x, y = torch.randn(n, 4), torch.randn(n, 1)

        class Data:
            def __init__(self):
                self.batch = TensorDict({"input_ids": x.clone(), "labels": y.clone()}, batch_size=[n])
                self.non_tensor_batch = {}
                self.meta_info = {}

        src = build_standin(ex)
        src = src.replace("        self.actor_module = [module]\n", "        self.actor_module = module\n")
        src = src.replace(
            "data_iterator=iter(micro_batches),",
            "data_iterator=MAKE_BATCH_GENERATOR(micro_batches, len(self.actor_module)),",
        )
        namespace = {
            "__name__": "rlprobe_legacy_standin",
            "torch": torch,
            "os": os,
            "logger": logging.getLogger(str(args.patched_file)),
            "partial": partial,
            "get_forward_backward_func": get_forward_backward_func,
            "MICRO_BATCH_SIZE": args.micro_batch_size,
            "EVENTS": Events(),
            "MAKE_BATCH_GENERATOR": make_batch_generator,
        }
        exec(compile(src, f"<stand-in around hooks from {args.patched_file}>", "exec"), namespace)
        actor = namespace["StandInActor"](wrapped, optimizer)
        phases = ["log_prob", "update_actor"]
        losses = []
        for call, phase in enumerate(phases):
            R.call, R.mb, R.chunk = call, None, None
            out = actor.compute_log_prob(Data()) if phase == "log_prob" else actor.update_policy(Data())
            # forward_step's outputs on the last stage: (loss, metrics) per micro-batch
            losses.append([float(o[0]) if isinstance(o, tuple) else repr(o) for o in out])
        result["losses"] = losses
        result["param_checksum"] = float(sum(p.detach().double().sum() for c in chunks for p in c.parameters()))
        result["open_step"] = actor._dump_micro_batch is not None
        args.dump_path = None
        result["events"] = R.events
        result.update(md.summarize_pp(R.events, phases, args))
    finally:
        with contextlib.suppress(Exception):
            mpu.destroy_model_parallel()
        dist.destroy_process_group()


# ---------------------------------------------------------------------------- main


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("backend", choices=("fsdp", "megatron"))
    parser.add_argument("--patched-file", help="megatron: the patched verl/workers/actor/megatron_actor.py")
    parser.add_argument("--micro-batches", type=int, default=3)
    parser.add_argument("--micro-batch-size", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    parser.add_argument("--pp", type=int, default=1, help="megatron: pipeline-parallel size (one process per stage)")
    parser.add_argument("--vpp", type=int, default=1, help="megatron: model chunks per rank (interleaved schedule)")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--store", help="file:// rendezvous shared by the ranks")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    result: dict = {"ok": False, "error": None, "backend": args.backend}
    code = 0
    try:
        if args.backend == "fsdp":
            run_fsdp(args, result)
        elif args.pp > 1 or args.vpp > 1:
            run_megatron_pp(args, result)
        else:
            run_megatron(args, result)
        result["ok"] = True
    except ExtractError as exc:
        result["error"] = f"ExtractError: {exc}"
        code = 2
    except Exception:
        result["error"] = traceback.format_exc()
        code = 1
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    return code


def preload() -> None:
    """What the runs import before verl's or the patched file's code, where this venv has it: torch, megatron-core
    (the Megatron venv) or transformers (verl's). `--runs`: once for all the runs."""
    import importlib.util

    import torch.distributed  # noqa: F401

    if importlib.util.find_spec("megatron") is not None:
        from megatron.core import parallel_state  # noqa: F401
        from megatron.core.pipeline_parallel import get_forward_backward_func  # noqa: F401
        from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: F401
    if importlib.util.find_spec("transformers") is not None:
        import transformers  # noqa: F401


if __name__ == "__main__":
    if sys.argv[1:2] == ["--runs"]:  # several runs, the imports once (tests/runtime/forked_runs.py)
        from forked_runs import run_forked

        sys.exit(run_forked(Path(sys.argv[2]), preload, main))
    sys.exit(main())
