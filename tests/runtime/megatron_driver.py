"""Run the Megatron dump hooks of a patched verl file through megatron-core's real schedule, on the CPU.

Run it with the python of the megatron venv (see ``megatron_venv.md``), not pytest's::

    <venv>/bin/python tests/runtime/megatron_driver.py \\
        --patched-file <site-packages>/verl/workers/engine/megatron/transformer_impl.py \\
        --phase-run update_actor --micro-batches 3 --out result.json

What is real and what is a stand-in
-----------------------------------
Real:

* the hook code. The patched file is parsed with ``ast`` (never imported: importing it
  needs verl and GPU-only megatron pieces). From class ``MegatronEngine`` the driver takes
  the six inserted methods (``_ensure_debugger``, ``_should_dump``,
  ``_log_update_actor_step``, ``_start_dump_step``, ``_dump_after_loss``,
  ``_finish_dump_step``) and the four ``self._... = ...`` lines that ``__init__`` gained;
  from ``forward_backward_batch``, ``MegatronEngineWithLMHead.forward_step`` and
  ``MegatronEngineWithLMHead.postprocess_micro_batch_func`` it takes the inserted
  statements, found by structure (the first statement of ``forward_backward_batch``; the
  ``if self._dump_should_record:`` statement right after ``losses_reduced =
  forward_backward_func(...)``, right after ``batch = next(batch_iter)``, and right before
  each ``return <loss>, ...``). All of it is executed exactly as written in that file. The
  methods run in a namespace holding only what verl's module gives them: ``os``,
  ``torch`` and a ``logger`` made like verl's (plus the typing names and ``TensorDict``,
  for annotations).
* megatron-core's pipeline schedule: ``get_forward_backward_func()`` after
  ``parallel_state.initialize_model_parallel(1, 1)`` on a one-process gloo group, which
  returns ``forward_backward_no_pipelining``; it calls the stand-in's ``forward_step`` per
  micro-batch, applies the loss function, and runs ``backward_step`` (``torch.autograd.backward``)
  per micro-batch itself. One CUDA-only line is worked around (see ``WORKAROUNDS``).
* msprobe (``mindstudio-probe``): ``PrecisionDebugger`` with the config named by
  ``MSPROBE_ACTOR_CONFIG``, writing its real dump.
* torch autograd, a real ``TransformerConfig`` as the model config, TensorDict micro-batches
  carrying ``request_id`` like verl's ``tu.get_tensordict`` makes them.

Stand-in:

* the engine: ``StandInEngine`` has verl's method names and parameter names (taken from the
  patched file) and the same control flow around the hooks (split the batch into
  micro-batches, ``get_forward_backward_func()(forward_step_func=partial(self.forward_step,
  ...), data_iterator=iter(micro_batches), model=self.module, ...)``; ``forward_step`` takes
  ``next(batch_iter)`` and returns ``(output, partial(postprocess_micro_batch_func,
  data=batch))``; ``postprocess_micro_batch_func`` computes ``loss``, ``scaled_loss`` (and,
  with ``--per-token-loss``, ``local_sum``/``local_num_tokens``) and returns them as verl
  does). ``infer_batch``/``train_batch`` mirror verl's ``BaseEngine``: ``torch.no_grad()``
  around the forward-only call; zero_grad / call / optimizer step for training.
* the model: a two-layer MLP (no megatron GPTModel, no megatron DDP wrapper) carrying a
  ``TransformerConfig`` and ``model_type`` as megatron's schedule expects; the loss is a mean
  squared error.

``--v1-batch``: micro-batches shaped as verl 0.9's V1 trainer hands them to the engine (request
ids only in each sample's ``extra_fields``, padding samples as ``_balance_batch`` adds them; see
``make_v1_batch`` for what is a stand-in there).

Pipeline parallelism: ``--pp 2 [--vpp 2] --rank R --world-size 2 --store FILE``, one process
per rank, runs megatron-core's ``forward_backward_pipelining_without_interleaving`` (or, with
``--vpp``, ``..._with_interleaving``) on gloo, with ``pp * vpp`` linear layers as model chunks
(``build_chunks``) and one more CPU workaround (``P2P_WORKAROUND``); ``--phase-run both``
alternates log-prob and update calls. The result then has ``pp_steps`` (what each msprobe step
of this rank holds: its units, i.e. micro-batch and chunk, their passes, the dump and the log
line), ``per_unit`` and the checks of ``summarize_pp`` (see ``megatron_venv.md``).

The driver never sets msprobe's switches (DUMP_ON, DUMP_PHASE, MSPROBE_ACTOR_CONFIG): a test
sets them in the environment. It finds the dump path by reading the msprobe config named by
MSPROBE_ACTOR_CONFIG (``--dump-path`` overrides). ``--write-config PATH --dump-path DIR``
writes a minimal statistics/mix msprobe config and exits, without importing torch.

Output (``--out``), JSON. Exit 0 and ``ok: true`` when the run completed; the checks are
reported, not enforced, so a test can expect "no dump" as well. Exit 1 (``error`` holds the
traceback, whose hook frames point at the patched file's own lines) when something raised;
exit 2 (``error`` starts with ``ExtractError``) when the patched file lacks a hook::

    {"ok": true, "error": null, "phase_run": "update_actor", "forward_only": false,
     "micro_batches": 3, "micro_batch_size": 2, "calls": 1, "msprobe_env": {...},
     "real": {"megatron_core": "0.16.1", "schedule": "...forward_backward_no_pipelining", ...},
     "workarounds": [...], "hook_globals": ["Any", ..., "logger", "os", "torch"],
     "extracted": {"methods": {"_ensure_debugger": [first, last line], ...}, ...},
     "events": [{"seq": 0, "event": "batch_taken", "call": 0, "mb": 0, "t_ms": ..., ...}, ...],
     "per_micro_batch": [{"call": 0, "mb": 0, "request_ids": ["req-0-0", "req-0-1"],
                          "order": ["batch_taken", "hook._start_dump_step", ...],
                          "started": true, "finished": true, "step": 0,
                          "finished_after_backward": true,        # training only
                          "finished_within_backward_step": true,  # training only
                          "finished_after_loss": true,            # forward-only only
                          "finished_before_next_micro_batch": true}, ...],
     "dump": {"dump_path": ..., "steps": [{"step": 0, "rank_dirs": ["rank0"],
              "files": {"rank0": ["construct.json", "dump.json", "stack.json"]},
              "dump_json": true, "data_keys": 21, "backward_keys": 9, "sample_keys": [...]}]},
     "update_actor_log": {"paths": [".../dump/<pid>/update_actor_log.jsonl"],
                          "lines": [{"step": 0, "rank": 0, "request_ids": [...]}]},
     "checks": {"dumped", "all_started", "all_finished", "all_finished_before_next",
                "dump_json_per_step", "log_line_per_step", "log_ids_match", "steps_distinct",
                training: "all_finished_after_backward", "all_finished_within_backward_step",
                "dump_has_backward_records"; forward-only: "all_finished_after_loss"},
     "per_call": [{"per_micro_batch", "dump", "update_actor_log", "checks"}, ...],
     "losses": [[...]], "grad_norm": 5.5, "timings_s": {"import_and_init", "build", "calls", "total"}}

``per_call`` (PP = 1): the same summary for each call alone, its checks those of the call's phase
(``--phase-run both``: a log-prob call's are forward-only's), over its own micro-batches; ``dump``
and ``update_actor_log`` are the whole run's, so a call's ``log_line_per_step`` and
``log_ids_match`` also fail when another call wrote log lines.

Events, in the order they happened (``mb`` is the micro-batch the schedule is on; hook
events that close a step also carry ``closes_mb``): ``batch_taken`` (the schedule's
forward_step pulled the micro-batch), ``hook._start_dump_step``, ``debugger.start``,
``model.forward``, ``loss``, ``hook._dump_after_loss``, ``model.backward_begin`` (the
gradient reached the model output), ``model.backward_end`` (every parameter accumulated its
gradient), ``hook._finish_dump_step`` (``active`` says whether a step was open),
``debugger.stop``, ``debugger.step``, ``schedule.backward_step_returned`` (megatron's
``backward_step`` returned; an observe-only wrapper) and ``forward_backward_func_returned``.
"""

from __future__ import annotations

import argparse
import ast
import glob
import json
import os
import sys
import time
import traceback
from pathlib import Path

HOOK_METHODS = (
    "_ensure_debugger",
    "_should_dump",
    "_log_update_actor_step",
    "_start_dump_step",
    "_dump_after_loss",
    "_finish_dump_step",
)
# Added by revision 2 of the patch (pipeline stages); extracted when the patched file has them.
OPTIONAL_HOOK_METHODS = ("_open_dump_step", "_dump_backward_begins")
INIT_ATTRS = ("_debugger", "_update_actor_logger_fp", "_dump_should_record", "_dump_micro_batch")
GUARD_ATTR = "_dump_should_record"
MSPROBE_SWITCHES = ("DUMP_ON", "DUMP_PHASE", "MSPROBE_ACTOR_CONFIG")
WORKAROUNDS = [
    "megatron.core.pipeline_parallel.schedules.forward_backward_no_pipelining allocates "
    "total_num_tokens with torch.zeros([], dtype=torch.int, device='cuda'), which fails on a CPU "
    "build of torch. The driver replaces the name `torch` inside that one module "
    "(schedules.torch) with a proxy that forwards everything to torch except zeros(), where "
    "device='cuda' becomes 'cpu'. Nothing else in megatron-core is changed.",
    "megatron.core.pipeline_parallel.schedules.backward_step is wrapped to record when it "
    "returns (observation only: it calls the original with the same arguments).",
]


class ExtractError(Exception):
    """The patched file lacks a piece the driver needs, or has it in an unexpected shape."""


# --------------------------------------------------------------------------- extraction (stdlib only)


def _segment(lines: list[str], node: ast.AST) -> str:
    """The source of ``node`` (with its decorators) as written, dedented by its column."""
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    col = node.col_offset
    out = []
    for line in lines[first - 1 : node.end_lineno]:
        prefix = line[:col]
        out.append(line[col:] if prefix.strip() == "" else line.lstrip())
    return "".join(out).rstrip("\n") + "\n"


def _indent(src: str, spaces: int) -> str:
    pad = " " * spaces
    return "".join(pad + line if line.strip() else line for line in src.splitlines(keepends=True))


def _is_guard(node: ast.AST) -> bool:
    """``if self._dump_should_record: ...`` with no else branch."""
    return (
        isinstance(node, ast.If)
        and isinstance(node.test, ast.Attribute)
        and node.test.attr == GUARD_ATTR
        and isinstance(node.test.value, ast.Name)
        and node.test.value.id == "self"
        and not node.orelse
    )


def _find_class(tree: ast.Module, name: str) -> ast.ClassDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise ExtractError(f"class {name} not found")


def _find_method(cls: ast.ClassDef, name: str) -> ast.FunctionDef:
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise ExtractError(f"{cls.name}.{name} not found")


def _bodies(node: ast.AST):
    """Every statement list under ``node`` (not entering nested functions, classes or lambdas)."""
    for field in ("body", "orelse", "finalbody"):
        stmts = getattr(node, field, None)
        if isinstance(stmts, list) and stmts and isinstance(stmts[0], ast.stmt):
            yield stmts
            for stmt in stmts:
                if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    yield from _bodies(stmt)
    for handler in getattr(node, "handlers", []) or []:
        yield from _bodies(handler)
    for case in getattr(node, "cases", []) or []:
        yield from _bodies(case)


def _signature(fn: ast.FunctionDef) -> str:
    """The parameter list without annotations (defaults kept as written)."""
    args = ast.parse(f"def f({ast.unparse(fn.args)}): pass").body[0].args
    for arg in args.posonlyargs + args.args + args.kwonlyargs + [a for a in (args.vararg, args.kwarg) if a]:
        arg.annotation = None
    return ast.unparse(args)


def _is_call_to(node: ast.AST, func_name: str) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == func_name


def extract_hooks(path: str | os.PathLike) -> dict:
    """Find the inserted hook code in a patched transformer_impl.py. Raises ExtractError."""
    text = Path(path).read_text()
    lines = text.splitlines(keepends=True)
    tree = ast.parse(text, filename=str(path))
    engine = _find_class(tree, "MegatronEngine")
    lm_head = _find_class(tree, "MegatronEngineWithLMHead")

    methods = {}
    present = {n.name for n in engine.body if isinstance(n, ast.FunctionDef)}
    # ... and the shared switch reader's methods (`_rlprobe_*`, issue 15) where the file has them.
    reader = tuple(sorted(n for n in present if n.startswith("_rlprobe_")))
    for name in HOOK_METHODS + tuple(n for n in OPTIONAL_HOOK_METHODS if n in present) + reader:
        node = _find_method(engine, name)
        first_lineno = min([node.lineno] + [d.lineno for d in node.decorator_list])
        methods[name] = {
            "lineno": node.lineno,
            "first_lineno": first_lineno,
            "end_lineno": node.end_lineno,
            "source": _segment(lines, node),
        }

    init = _find_method(engine, "__init__")
    init_stmts = []
    for index, stmt in enumerate(init.body):
        if (
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Attribute)
            and isinstance(stmt.targets[0].value, ast.Name)
            and stmt.targets[0].value.id == "self"
            and stmt.targets[0].attr in INIT_ATTRS
        ):
            init_stmts.append((index, stmt))
    found = [s.targets[0].attr for _, s in init_stmts]
    missing = [a for a in INIT_ATTRS if a not in found]
    if missing:
        raise ExtractError(f"MegatronEngine.__init__ does not set self.{', self.'.join(missing)}")
    init_at_end = [i for i, _ in init_stmts] == list(range(len(init.body) - len(init_stmts), len(init.body)))

    fbb = _find_method(engine, "forward_backward_batch")
    body = fbb.body
    first = body[1] if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) else body[0]
    if not (
        isinstance(first, ast.Assign)
        and isinstance(first.targets[0], ast.Attribute)
        and first.targets[0].attr == GUARD_ATTR
    ):
        raise ExtractError(
            f"first statement of forward_backward_batch (line {first.lineno}) is not "
            f"self.{GUARD_ATTR} = ...: {ast.unparse(first)!r}"
        )
    fbb_after = None
    for stmts in _bodies(fbb):
        for i, stmt in enumerate(stmts):
            if (
                isinstance(stmt, ast.Assign)
                and isinstance(stmt.targets[0], ast.Name)
                and stmt.targets[0].id == "losses_reduced"
                and _is_call_to(stmt.value, "forward_backward_func")
            ):
                nxt = stmts[i + 1] if i + 1 < len(stmts) else None
                if nxt is None or not _is_guard(nxt):
                    raise ExtractError(
                        f"no `if self.{GUARD_ATTR}:` statement right after losses_reduced = "
                        f"forward_backward_func(...) (line {stmt.lineno})"
                    )
                fbb_after = nxt
    if fbb_after is None:
        raise ExtractError("losses_reduced = forward_backward_func(...) not found in forward_backward_batch")

    forward_step = _find_method(lm_head, "forward_step")
    fs_start = None
    for i, stmt in enumerate(forward_step.body):
        value = getattr(stmt, "value", None)
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and _is_call_to(value, "next"):
            nxt = forward_step.body[i + 1] if i + 1 < len(forward_step.body) else None
            if nxt is None or not _is_guard(nxt):
                raise ExtractError(
                    f"no `if self.{GUARD_ATTR}:` statement right after `batch = next(batch_iter)` "
                    f"(line {stmt.lineno}) in MegatronEngineWithLMHead.forward_step"
                )
            fs_start = nxt
            break
    if fs_start is None:
        raise ExtractError("`batch = next(batch_iter)` not found in MegatronEngineWithLMHead.forward_step")

    postprocess = _find_method(lm_head, "postprocess_micro_batch_func")
    sites = []
    for stmts in _bodies(postprocess):
        for i, stmt in enumerate(stmts):
            if isinstance(stmt, ast.Return) and isinstance(stmt.value, ast.Tuple):
                prev = stmts[i - 1] if i > 0 else None
                loss_expr = ast.unparse(stmt.value.elts[0])
                if prev is None or not _is_guard(prev):
                    raise ExtractError(
                        f"no `if self.{GUARD_ATTR}:` statement right before `{ast.unparse(stmt)}` "
                        f"(line {stmt.lineno}) in postprocess_micro_batch_func"
                    )
                calls = [
                    n
                    for n in ast.walk(prev)
                    if isinstance(n, ast.Call) and ast.unparse(n.func) == "self._dump_after_loss"
                ]
                if not calls or not calls[0].args or ast.unparse(calls[0].args[0]) != loss_expr:
                    raise ExtractError(
                        f"the statement before `{ast.unparse(stmt)}` (line {prev.lineno}) does not call "
                        f"self._dump_after_loss({loss_expr}, ...)"
                    )
                sites.append(
                    {
                        "arity": len(stmt.value.elts),
                        "loss_expr": loss_expr,
                        "guard_lineno": prev.lineno,
                        "guard_source": _segment(lines, prev),
                        "return_lineno": stmt.lineno,
                        "return_source": _segment(lines, stmt),
                    }
                )
    if not any(s["arity"] == 2 for s in sites):
        raise ExtractError("postprocess_micro_batch_func has no hooked `return <loss>, <output>`")

    def piece(node):
        return {"lineno": node.lineno, "end_lineno": node.end_lineno, "source": _segment(lines, node)}

    return {
        "path": str(path),
        "methods": methods,
        "init": {
            "at_end_of_init": init_at_end,
            "statements": [piece(s) for _, s in init_stmts],
        },
        "forward_backward_batch_first": piece(first),
        "forward_backward_batch_after_call": piece(fbb_after),
        "forward_step_after_next": piece(fs_start),
        "forward_step_signature": _signature(forward_step),
        "forward_step_params": [a.arg for a in forward_step.args.args],
        "postprocess_signature": _signature(postprocess),
        "postprocess_sites": sites,
    }


# --------------------------------------------------------------------------- stand-in engine source

STANDIN_TEMPLATE = '''
class StandInEngine:
    """Stand-in for verl's MegatronEngineWithLMHead: verl's names, verl's control flow."""

    def __init__(self, module, optimizer):
        self.module = module  # list of model chunks, as verl's self.module
        self.optimizer = optimizer
        self.tf_config = module[0].config
        # verl's McoreEngineConfig: forward_only marks a ref engine, which never dumps.
        self.engine_config = types.SimpleNamespace(forward_only=False)
        self.mode = None
@@INIT@@

    def get_data_parallel_group(self):
        return mpu.get_data_parallel_group()

    def infer_batch(self, data, loss_function=None):
        with torch.no_grad():
            return self.forward_backward_batch(data, loss_function, forward_only=True)

    def train_batch(self, data, loss_function):
        self.optimizer.zero_grad()
        outputs = self.forward_backward_batch(data, loss_function, forward_only=False)
        _rlp.rec("optimizer_step")
        self.optimizer.step()
        return outputs

    def forward_backward_batch(self, data, loss_function, forward_only=False):
@@FBB_FIRST@@
        micro_batches = _rlp.split_micro_batches(data)
        n_micro_batch = len(micro_batches)
        for micro_batch in micro_batches:
            _rlp.assign_non_tensor(micro_batch, num_micro_batch=n_micro_batch)

        forward_backward_func = get_forward_backward_func()

        postprocess_micro_batch_func = partial(
            self.postprocess_micro_batch_func,
            forward_only=forward_only,
            loss_function=loss_function,
        )
        forward_step = partial(
            self.forward_step,
@@LOGITS_KW@@
            postprocess_micro_batch_func=postprocess_micro_batch_func,
        )
        batch_generator = _rlp.make_batch_generator(micro_batches, vpp_size=len(self.module))

        losses_reduced = forward_backward_func(
            forward_step_func=forward_step,
            data_iterator=batch_generator,
            model=self.module,
            num_microbatches=n_micro_batch,
            seq_length=1,  # the communication shape is obtained via p2p comm (variable_seq_lengths)
            micro_batch_size=1,
            forward_only=forward_only,
        )
        _rlp.schedule_returned()
@@FBB_AFTER@@
        return losses_reduced

    def forward_step(@@FS_SIG@@):
        batch = next(batch_iter)
@@FS_START@@
        batch = batch.to("cpu")
        output = model(batch["input_ids"])
        return output, partial(postprocess_micro_batch_func, data=batch)

    def postprocess_micro_batch_func(@@PP_SIG@@):
        model_output = {"values": output}
        loss, metrics = loss_function(model_output=model_output, data=data, dp_group=self.get_data_parallel_group())
        # scale loss by num_micro_batch because megatron will scale loss by n_micro_batch
        scaled_loss = loss * data["num_micro_batch"]
        output = {"loss": loss.detach().item(), "metrics": metrics, "model_output": output.detach()}
        if self.tf_config.calculate_per_token_loss:
            local_num_tokens = torch.tensor(_rlp.num_tokens(data), dtype=torch.int)
            local_sum = loss * local_num_tokens
@@PP_RETURN3@@
@@PP_RETURN2@@
'''


def build_standin_source(ex: dict) -> str:
    init_src = "".join(_indent(s["source"], 8) for s in ex["init"]["statements"])
    sites = {}
    for site in ex["postprocess_sites"]:
        sites.setdefault(site["arity"], site)  # the first hooked return of each arity

    def site_src(arity, spaces):
        site = sites.get(arity)
        if site is None:
            message = f"raise RuntimeError('the patched file has no hooked return of {arity} values')\n"
            return _indent(message, spaces)
        return _indent(site["guard_source"], spaces) + _indent(site["return_source"], spaces)

    logits_kw = "logits_processor_func=loss_function," if "logits_processor_func" in ex["forward_step_params"] else ""
    out = STANDIN_TEMPLATE
    for marker, value in (
        ("@@INIT@@\n", init_src),
        ("@@FBB_FIRST@@\n", _indent(ex["forward_backward_batch_first"]["source"], 8)),
        ("@@FBB_AFTER@@\n", _indent(ex["forward_backward_batch_after_call"]["source"], 8)),
        ("@@FS_START@@\n", _indent(ex["forward_step_after_next"]["source"], 8)),
        ("@@PP_RETURN3@@\n", site_src(3, 12)),
        ("@@PP_RETURN2@@\n", site_src(2, 8)),
        ("@@LOGITS_KW@@\n", (" " * 12 + logits_kw + "\n") if logits_kw else ""),
        ("@@FS_SIG@@", ex["forward_step_signature"]),
        ("@@PP_SIG@@", ex["postprocess_signature"]),
    ):
        if marker not in out:
            raise AssertionError(marker)
        out = out.replace(marker, value)
    return out


# --------------------------------------------------------------------------- msprobe config


def write_msprobe_config(path: str | os.PathLike, dump_path: str | os.PathLike) -> dict:
    """A minimal msprobe config: statistics task, mix level (module + API), every rank and step.

    msprobe 26.2.0 needs no "statistics" section: scope/list default to empty, data_mode to
    all, summary_mode to statistics."""
    config = {
        "task": "statistics",
        "dump_path": str(dump_path),
        "rank": [],
        "step": [],
        "level": "mix",
        "async_dump": False,
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(config, indent=2))
    os.chmod(path, 0o640)
    return config


# --------------------------------------------------------------------------- the run (needs the venv)


class Recorder:
    def __init__(self):
        self.events = []
        self.call = None
        self.mb = None
        self.t0 = time.perf_counter()

    def rec(self, event, **detail):
        entry = {"seq": len(self.events), "event": event, "call": self.call, "mb": self.mb}
        if getattr(self, "chunk", None) is not None:
            entry["chunk"] = self.chunk
        entry["t_ms"] = round((time.perf_counter() - self.t0) * 1000, 3)
        entry.update(detail)
        self.events.append(entry)
        return entry


def run(args: argparse.Namespace, result: dict) -> None:
    timings = result["timings_s"]
    t = time.perf_counter()
    ex = extract_hooks(args.patched_file)
    result["extracted"] = {
        "methods": {k: [v["lineno"], v["end_lineno"]] for k, v in ex["methods"].items()},
        "init_statements": [[s["lineno"], s["source"].strip()] for s in ex["init"]["statements"]],
        "init_at_end": ex["init"]["at_end_of_init"],
        "forward_backward_batch_first": [
            ex["forward_backward_batch_first"]["lineno"],
            ex["forward_backward_batch_first"]["source"].strip(),
        ],
        "forward_backward_batch_after_call": [
            ex["forward_backward_batch_after_call"]["lineno"],
            ex["forward_backward_batch_after_call"]["source"].strip(),
        ],
        "forward_step_after_next": [
            ex["forward_step_after_next"]["lineno"],
            ex["forward_step_after_next"]["source"].strip(),
        ],
        "forward_step_params": ex["forward_step_params"],
        "postprocess_sites": [
            {k: s[k] for k in ("arity", "loss_expr", "guard_lineno", "return_lineno")} for s in ex["postprocess_sites"]
        ],
    }
    if args.per_token_loss and not any(s["arity"] == 3 for s in ex["postprocess_sites"]):
        raise ExtractError("--per-token-loss needs a hooked 3-value return in postprocess_micro_batch_func")

    import importlib.metadata as md
    import linecache
    import logging
    import types
    import typing
    from functools import partial

    import torch
    import torch.distributed as dist

    torch.manual_seed(args.seed)
    workdir = Path(args.out).resolve().parent
    workdir.mkdir(parents=True, exist_ok=True)
    store = Path(args.store) if args.store else workdir / f".pg_store_{os.getpid()}"
    if args.world_size == 1 and store.exists():
        store.unlink()
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=args.rank, world_size=args.world_size, timeout=PG_TIMEOUT
    )
    pipelined = args.pp > 1 or args.vpp > 1
    try:
        from megatron.core import parallel_state as mpu
        from megatron.core.enums import ModelType
        from megatron.core.pipeline_parallel import get_forward_backward_func, schedules
        from megatron.core.transformer.transformer_config import TransformerConfig

        mpu.initialize_model_parallel(
            tensor_model_parallel_size=1,
            pipeline_model_parallel_size=args.pp,
            virtual_pipeline_model_parallel_size=args.vpp if args.vpp > 1 else None,
        )
        timings["import_and_init"] = round(time.perf_counter() - t, 3)

        R = Recorder()
        R.chunk = None

        # -- workaround: the one CUDA-only allocation in forward_backward_no_pipelining
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
        _backward_step = schedules.backward_step

        def backward_step(*a, **k):  # observation only
            out = _backward_step(*a, **k)
            R.rec("schedule.backward_step_returned")
            return out

        schedules.backward_step = backward_step
        if pipelined:
            result["workarounds_pp"] = cpu_p2p_workaround(torch)

        # -- msprobe: record start/stop/step (classmethods, so wrap on the class)
        from msprobe.pytorch import PrecisionDebugger

        def _wrap(name):
            orig = getattr(PrecisionDebugger, name).__func__

            def wrapper(cls, *a, **k):
                service = getattr(cls._instance, "service", None)
                before = getattr(service, "current_iter", None)
                entry = R.rec(f"debugger.{name}", current_iter=before)
                out = orig(cls, *a, **k)
                if name == "step":
                    entry["loop_after"] = getattr(service, "loop", None)
                return out

            setattr(PrecisionDebugger, name, classmethod(wrapper))

        for name in ("start", "stop", "step"):
            _wrap(name)

        # -- micro-batch plumbing
        try:
            from tensordict import NonTensorData, NonTensorStack, TensorDict
        except ImportError:
            TensorDict = None
        use_td = args.batch_kind == "tensordict" or (args.batch_kind == "auto" and TensorDict is not None)
        if use_td and TensorDict is None:
            raise RuntimeError("--batch-kind tensordict needs the tensordict package")
        mb_index = {}

        class RecordingIterator:
            """iter(micro_batches), recording which micro-batch the schedule takes (for model chunk ``chunk``)."""

            def __init__(self, items, chunk=None):
                self._items = list(items)
                self._pos = 0
                self._chunk = chunk
                for i, item in enumerate(self._items):
                    mb_index[id(item)] = i

            def __iter__(self):
                return self

            def __next__(self):
                if self._pos >= len(self._items):
                    raise StopIteration
                item = self._items[self._pos]
                R.mb, R.chunk = self._pos, self._chunk
                self._pos += 1
                R.rec("batch_taken", request_ids=request_ids_of(item))
                return item

        def request_ids_of(batch):
            if args.v1_batch:
                # the driver's own reading of what it built (make_batch): real samples' ids, no padding
                fields, uids = batch["extra_fields"], batch["uid"]
                fields = fields.tolist() if hasattr(fields, "tolist") else list(fields)
                uids = uids.tolist() if hasattr(uids, "tolist") else list(uids)
                return [f["request_id"] for f, u in zip(fields, uids) if not str(u).startswith("pad")]
            ids = batch.get("request_id") if hasattr(batch, "get") else None
            if ids is None:
                return None
            return [str(x) for x in (ids.tolist() if hasattr(ids, "tolist") else ids)]

        def make_batch(call):
            n = args.micro_batches * args.micro_batch_size
            x = torch.randn(n, 4)
            y = torch.randn(n, 1)
            if args.v1_batch:
                return make_v1_batch(call, n, x, y)
            ids = [f"req-{call}-{i}" for i in range(n)]
            if use_td:
                td = TensorDict({"input_ids": x, "labels": y}, batch_size=[n])
                # as verl's tu.get_tensordict stores a list of per-sample values
                td["request_id"] = NonTensorStack.from_list([NonTensorData(r) for r in ids])
                return td
            return {"input_ids": x, "labels": y, "request_id": ids}

        def make_v1_batch(call, n, x, y):
            """The batch as verl 0.9's V1 trainer hands it to the engine: no top-level request_id;
            each sample's fields in a per-sample dict ``extra_fields`` (where verl.request-id puts
            ``request_id``) and a ``uid``. Every sample whose index is 1 mod 3 is a padding sample as
            verl 0.9.1's ``upsample_batch_to_divisible_size`` (padding_utils.py) makes them: one uid
            ``pad<uuid4 hex>`` shared by all padding samples, and a deep copy of the first sample's
            fields (so sample 0's request id); ``_balance_batch`` then reorders the batch, which puts
            padding samples anywhere. Stand-ins: the ids and the other fields are made up, the batch is
            built here instead of fetched from TransferQueue, and the padding samples keep random
            tokens instead of verl's eos template."""
            import copy
            import uuid

            fields = [
                {"request_id": f"v1-{call}-{i}", "num_turns": 2, "reward_extra_info": {"acc": 1.0}} for i in range(n)
            ]
            uids = [f"uid-{call}-{i}" for i in range(n)]
            pad_uid = f"pad{uuid.uuid4().hex}"
            for i in range(n):
                if i % 3 == 1:
                    uids[i] = pad_uid
                    fields[i] = copy.deepcopy(fields[0])
            if not use_td:
                return {"input_ids": x, "labels": y, "uid": uids, "extra_fields": fields}
            td = TensorDict({"input_ids": x, "labels": y}, batch_size=[n])
            # as verl's tu.get_tensordict stores lists of per-sample values (dicts included)
            td["uid"] = NonTensorStack.from_list([NonTensorData(u) for u in uids])
            td["extra_fields"] = NonTensorStack.from_list([NonTensorData(f) for f in fields])
            return td

        class _DictBatch(dict):
            def to(self, device):
                return _DictBatch({k: (v.to(device) if hasattr(v, "to") else v) for k, v in self.items()})

        def split_micro_batches(data):
            size = args.micro_batch_size
            if use_td:
                return list(data.split(size, dim=0))
            n = len(data["input_ids"])
            return [_DictBatch({k: v[i : i + size] for k, v in data.items()}) for i in range(0, n, size)]

        def assign_non_tensor(batch, **kwargs):
            for k, v in kwargs.items():
                batch[k] = NonTensorData(v) if use_td else v

        def num_tokens(data):
            return int(data["input_ids"].shape[0])

        def make_batch_generator(micro_batches, vpp_size):
            # verl's make_batch_generator: one iterator per model chunk under virtual pipelining
            if vpp_size > 1:
                return [RecordingIterator(micro_batches, chunk) for chunk in range(vpp_size)]
            return RecordingIterator(micro_batches, 0 if pipelined else None)

        def schedule_returned():
            R.mb = None
            R.rec("forward_backward_func_returned")

        rlp = types.SimpleNamespace(
            rec=R.rec,
            schedule_returned=schedule_returned,
            RecordingIterator=RecordingIterator,
            make_batch_generator=make_batch_generator,
            split_micro_batches=split_micro_batches,
            assign_non_tensor=assign_non_tensor,
            num_tokens=num_tokens,
        )

        # -- the model: tiny MLP with a real TransformerConfig, instrumented
        pp_kwargs = {}
        if pipelined:
            pp_kwargs = {
                "pipeline_model_parallel_size": args.pp,
                "virtual_pipeline_model_parallel_size": args.vpp if args.vpp > 1 else None,
                "pipeline_dtype": torch.float32,
                "variable_seq_lengths": True,  # as verl sets it: shapes travel with the activations
                "moe_token_dispatcher_type": "alltoall",  # (no MoE here) the default refuses variable lengths
            }
        config = TransformerConfig(
            num_layers=max(1, args.pp * args.vpp),
            hidden_size=8,
            num_attention_heads=1,
            calculate_per_token_loss=args.per_token_loss,
            **pp_kwargs,
        )

        class TinyModel(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.config = config
                self.model_type = ModelType.encoder_or_decoder
                self.fc1 = torch.nn.Linear(4, 8)
                self.act = torch.nn.Tanh()
                self.fc2 = torch.nn.Linear(8, 1)
                self._pending = 0
                for p in self.parameters():
                    p.register_post_accumulate_grad_hook(self._grad_accumulated)

            def set_input_tensor(self, input_tensor):
                self.input_tensor = input_tensor

            def _grad_accumulated(self, param):
                self._pending -= 1
                if self._pending == 0:
                    R.rec("model.backward_end")

            def _backward_begin(self, grad):
                self._pending = sum(1 for _ in self.parameters())
                R.rec("model.backward_begin")
                return grad

            def forward(self, x):
                out = self.fc2(self.act(self.fc1(x)))
                R.rec("model.forward", grad_enabled=torch.is_grad_enabled())
                if out.requires_grad:
                    out.register_hook(self._backward_begin)
                return out

        if pipelined:
            chunks = build_chunks(torch, config, ModelType.encoder_or_decoder, args, R)
            model = torch.nn.ModuleList(chunks)  # parameters of every chunk of this rank
        else:
            model = TinyModel()
            chunks = [model]
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

        def loss_function(model_output, data, dp_group=None):
            loss = torch.nn.functional.mse_loss(model_output["values"], data["labels"])
            R.rec("loss", requires_grad=loss.requires_grad)
            return loss, {"mse": loss.detach().item()}

        # -- build: hook methods in verl-like module globals; the stand-in around them
        logger = logging.getLogger(str(args.patched_file))
        logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "WARN"))
        hook_globals = {
            "__name__": "verl_patched_hooks",
            "__builtins__": __builtins__,
            "os": os,
            "torch": torch,
            "logger": logger,
        }
        annotation_names = {
            n: getattr(typing, n) for n in ("Any", "Callable", "ContextManager", "Iterator", "Optional")
        }
        annotation_names["TensorDict"] = TensorDict if TensorDict is not None else object
        hook_globals.update(annotation_names)
        result["hook_globals"] = sorted(k for k in hook_globals if not k.startswith("__"))

        standin_src = build_standin_source(ex)
        standin_file = f"<rlprobe-standin from {args.patched_file}>"
        linecache.cache[standin_file] = (len(standin_src), None, standin_src.splitlines(True), standin_file)
        standin_globals = {
            "__name__": "rlprobe_standin",
            "torch": torch,
            "os": os,
            "logger": logger,
            "partial": partial,
            "mpu": mpu,
            "get_forward_backward_func": get_forward_backward_func,
            "_rlp": rlp,
            "types": types,
        }
        exec(compile(standin_src, standin_file, "exec"), standin_globals)
        StandIn = standin_globals["StandInEngine"]

        for name, info in ex["methods"].items():
            tree = ast.parse(info["source"], filename=str(args.patched_file))
            ast.increment_lineno(tree, info["first_lineno"] - 1)  # tracebacks point into the patched file
            ns = {}
            exec(compile(tree, str(args.patched_file), "exec"), hook_globals, ns)
            setattr(StandIn, name, ns[name])

        def _observe(name, closes):
            orig = getattr(StandIn, name)

            def wrapper(self, *a, **k):
                detail = {}
                if closes:
                    open_batch = getattr(self, "_dump_micro_batch", None)
                    if isinstance(open_batch, dict) and "batch" in open_batch and "passes" in open_batch:
                        open_batch = open_batch["batch"]  # revision 2: the open step's unit
                    detail["active"] = open_batch is not None
                    detail["closes_mb"] = mb_index.get(id(open_batch)) if open_batch is not None else None
                R.rec(f"hook.{name}", **detail)
                return orig(self, *a, **k)

            wrapper.__wrapped__ = orig
            setattr(StandIn, name, wrapper)

        _observe("_start_dump_step", closes=True)
        _observe("_dump_after_loss", closes=False)
        _observe("_finish_dump_step", closes=True)

        engine = StandIn(chunks, optimizer)
        result["init_attrs_after_init"] = {a: repr(getattr(engine, a, "<missing>")) for a in INIT_ATTRS}
        timings["build"] = round(time.perf_counter() - t - timings["import_and_init"], 3)

        # -- the calls
        forward_only = args.phase_run == "log_prob"
        losses = []
        t_calls = time.perf_counter()
        phases = call_phases(args)
        # every batch is made before the first call: msprobe's seed_all (when dumping) reseeds torch
        batches = [make_batch(call) for call in range(args.calls)]
        for call in range(args.calls):
            forward_only = phases[call] == "log_prob"
            R.call, R.mb, R.chunk = call, None, None
            data = batches[call]
            R.rec("call_begin", forward_only=forward_only)
            if forward_only:
                out = engine.infer_batch(data, loss_function)
            else:
                out = engine.train_batch(data, loss_function)
            R.mb = None
            R.rec("call_end")
            losses.append([o["loss"] if isinstance(o, dict) else None for o in out])
        timings["calls"] = round(time.perf_counter() - t_calls, 3)
        result["losses"] = losses
        grads = [p.grad.norm().item() for p in model.parameters() if p.grad is not None]
        result["grad_norm"] = float(sum(g * g for g in grads) ** 0.5) if grads else None
        if engine._update_actor_logger_fp is not None:
            engine._update_actor_logger_fp.flush()

        result["real"] = {
            "megatron_core": md.version("megatron-core"),
            "schedule": f"{schedules.__name__}.{get_forward_backward_func().__name__}",
            "process_group": f"{dist.get_backend()} world_size={dist.get_world_size()}",
            "model_parallel": f"TP=1 PP={mpu.get_pipeline_model_parallel_world_size()} "
            f"VPP={mpu.get_virtual_pipeline_model_parallel_world_size()} "
            f"pp_rank={mpu.get_pipeline_model_parallel_rank()} (parallel_state.initialize_model_parallel)",
            "model_config": f"{type(config).__module__}.{type(config).__name__}",
            "msprobe": md.version("mindstudio-probe"),
            "torch": torch.__version__,
            "tensordict": md.version("tensordict") if use_td else None,
            "micro_batch_type": "TensorDict" if use_td else "dict",
            "hook_code_from": str(Path(args.patched_file).resolve()),
        }
        result["workarounds"] = WORKAROUNDS
        result["events"] = R.events
        if pipelined:
            result.update(summarize_pp(R.events, phases, args))
        else:
            result.update(summarize(R.events, forward_only, args))
            # each call on its own: its micro-batches, under its own phase's checks
            result["per_call"] = [
                summarize([e for e in R.events if e["call"] == call], phases[call] == "log_prob", args)
                for call in range(args.calls)
            ]
    finally:
        try:
            from megatron.core import parallel_state

            parallel_state.destroy_model_parallel()
        except Exception:
            pass
        dist.destroy_process_group()
        if args.world_size == 1 and store.exists():
            store.unlink()


# --------------------------------------------------------------------------- summary


def dump_path_from_env(args) -> str | None:
    if args.dump_path:
        return str(args.dump_path)
    cfg = os.environ.get("MSPROBE_ACTOR_CONFIG")
    if cfg and os.path.isfile(cfg):
        try:
            return json.loads(Path(cfg).read_text()).get("dump_path")
        except (OSError, ValueError):
            return None
    return None


def summarize(events: list[dict], forward_only: bool, args) -> dict:
    per_mb = []
    keys = sorted({(e["call"], e["mb"]) for e in events if e["event"] == "batch_taken"})
    for call, mb in keys:
        closing = None  # the _finish_dump_step that closed this micro-batch, and what followed it
        mine = []
        for i, e in enumerate(events):
            if e["call"] != call:
                continue
            if e["event"] in ("hook._finish_dump_step", "hook._start_dump_step") and e.get("closes_mb") is not None:
                if e["closes_mb"] == mb and e.get("active"):
                    closing = i
            if e["mb"] == mb and e["event"] not in ("debugger.stop", "debugger.step", "hook._finish_dump_step"):
                mine.append(i)
        if closing is not None:
            mine.append(closing)
            # the stop/step the closing call made come right after it
            for j in range(closing + 1, len(events)):
                if events[j]["event"] in ("debugger.stop", "debugger.step"):
                    mine.append(j)
                    if events[j]["event"] == "debugger.step":
                        break
                elif events[j]["event"].startswith("hook."):
                    break
        mine = sorted(set(mine))
        order = [events[i]["event"] for i in mine]
        start = next((i for i in mine if events[i]["event"] == "debugger.start"), None)
        step = next((i for i in mine if events[i]["event"] == "debugger.step"), None)
        forward = next((i for i in mine if events[i]["event"] == "model.forward"), None)
        loss = next((i for i in mine if events[i]["event"] == "loss"), None)
        bwd_end = next((i for i in mine if events[i]["event"] == "model.backward_end"), None)
        next_taken = next(
            (
                i
                for i, e in enumerate(events)
                if e["call"] == call and e["event"] == "batch_taken" and e["mb"] == mb + 1
            ),
            None,
        )
        call_end = next(
            (i for i, e in enumerate(events) if e["call"] == call and e["event"] == "call_end"), len(events)
        )
        taken = next(
            i for i, e in enumerate(events) if e["call"] == call and e["mb"] == mb and e["event"] == "batch_taken"
        )
        entry = {
            "call": call,
            "mb": mb,
            "request_ids": events[taken].get("request_ids"),
            "order": order,
            "started": start is not None and forward is not None and start < forward,
            "finished": step is not None,
            "step": events[step]["current_iter"] if step is not None else None,
        }
        if forward_only:
            entry["finished_after_loss"] = step is not None and loss is not None and step > loss
        else:
            bwd_returned = next((i for i in mine if events[i]["event"] == "schedule.backward_step_returned"), None)
            entry["finished_after_backward"] = step is not None and bwd_end is not None and step > bwd_end
            # closed by the end-of-backward callback, i.e. before megatron's backward_step returned
            entry["finished_within_backward_step"] = (
                entry["finished_after_backward"] and bwd_returned is not None and step < bwd_returned
            )
        limit = next_taken if next_taken is not None else call_end
        entry["finished_before_next_micro_batch"] = step is not None and step < limit
        per_mb.append(entry)

    dump_path = dump_path_from_env(args)
    steps = []
    if dump_path and os.path.isdir(dump_path):
        step_dirs = [p for p in glob.glob(os.path.join(dump_path, "step*")) if p.rsplit("step", 1)[1].isdigit()]
        for step_dir in sorted(step_dirs, key=lambda p: int(p.rsplit("step", 1)[1])):
            rank_dirs = sorted(d for d in os.listdir(step_dir) if os.path.isdir(os.path.join(step_dir, d)))
            info = {"step": int(step_dir.rsplit("step", 1)[1]), "rank_dirs": rank_dirs, "files": {}}
            for rd in rank_dirs:
                info["files"][rd] = sorted(os.listdir(os.path.join(step_dir, rd)))
            dump_jsons = [os.path.join(step_dir, rd, "dump.json") for rd in rank_dirs]
            dump_jsons = [p for p in dump_jsons if os.path.isfile(p)]
            info["dump_json"] = bool(dump_jsons)
            if dump_jsons:
                try:
                    data = json.loads(Path(dump_jsons[0]).read_text()).get("data", {})
                    info["data_keys"] = len(data)
                    info["backward_keys"] = sum(1 for k in data if "backward" in k)
                    info["sample_keys"] = list(data)[:6]
                except ValueError as exc:
                    info["dump_json_error"] = str(exc)
            steps.append(info)
    log_paths = sorted(glob.glob(os.path.join(dump_path, "*", "update_actor_log.jsonl"))) if dump_path else []
    log_lines = []
    for p in log_paths:
        for line in Path(p).read_text().splitlines():
            if line.strip():
                try:
                    log_lines.append(json.loads(line))
                except ValueError:
                    log_lines.append({"unparsed": line})

    step_numbers = [e["step"] for e in per_mb if e["finished"]]
    dumped_steps = {s["step"]: s for s in steps}
    checks = {
        "dumped": any(e["event"] == "debugger.start" for e in events),
        "all_started": bool(per_mb) and all(e["started"] for e in per_mb),
        "all_finished": bool(per_mb) and all(e["finished"] for e in per_mb),
        "all_finished_before_next": bool(per_mb) and all(e["finished_before_next_micro_batch"] for e in per_mb),
        "dump_json_per_step": bool(step_numbers)
        and all(dumped_steps.get(s, {}).get("dump_json") for s in step_numbers),
        "log_line_per_step": sorted(step_numbers) == sorted(line.get("step") for line in log_lines),
        "log_ids_match": bool(per_mb)
        and [line.get("request_ids") for line in log_lines] == [e["request_ids"] for e in per_mb if e["finished"]],
        "steps_distinct": len(step_numbers) == len(set(step_numbers)),
    }
    if forward_only:
        checks["all_finished_after_loss"] = bool(per_mb) and all(e["finished_after_loss"] for e in per_mb)
    else:
        checks["all_finished_after_backward"] = bool(per_mb) and all(e["finished_after_backward"] for e in per_mb)
        checks["all_finished_within_backward_step"] = bool(per_mb) and all(
            e["finished_within_backward_step"] for e in per_mb
        )
        # a training step closed after backward holds the backward records too
        checks["dump_has_backward_records"] = bool(step_numbers) and all(
            dumped_steps.get(s, {}).get("backward_keys", 0) > 0 for s in step_numbers
        )
    return {
        "per_micro_batch": per_mb,
        "dump": {"dump_path": dump_path, "steps": steps},
        "update_actor_log": {"paths": log_paths, "lines": log_lines},
        "checks": checks,
    }


# --------------------------------------------------------------------------- pipeline parallelism (--pp, --vpp)

# A rank that waits on a peer which died fails instead of hanging for gloo's 30 minutes.
PG_TIMEOUT = __import__("datetime").timedelta(seconds=int(os.environ.get("RLPROBE_PG_TIMEOUT_S", "90")))
P2P_WORKAROUND = (
    "megatron.core.pipeline_parallel.p2p_communication allocates its receive buffers (and, with "
    "variable_seq_lengths, the shape messages) on torch.cuda.current_device() and calls "
    "torch.cuda.synchronize() after batched p2p. The driver replaces the name `torch` inside that one "
    "module with a proxy whose cuda.current_device() is 'cpu' and cuda.synchronize() does nothing; "
    "the sends and receives themselves are torch.distributed's, on gloo."
)


def call_phases(args: argparse.Namespace) -> list[str]:
    """The phase of each call: ``--phase-run both`` alternates log_prob, update_actor."""
    if args.phase_run == "both":
        return [("log_prob", "update_actor")[i % 2] for i in range(args.calls)]
    return [args.phase_run] * args.calls


def cpu_p2p_workaround(torch) -> list[str]:
    from megatron.core.pipeline_parallel import p2p_communication

    class _CpuCuda:
        def __getattr__(self, name):
            return getattr(torch.cuda, name)

        @staticmethod
        def current_device():
            return "cpu"

        @staticmethod
        def synchronize(*a, **k):
            return None

    class _P2pTorch:
        cuda = _CpuCuda()

        def __getattr__(self, name):
            return getattr(torch, name)

    if p2p_communication.torch is torch:
        p2p_communication.torch = _P2pTorch()
    return [P2P_WORKAROUND]


def build_chunks(torch, config, model_type, args: argparse.Namespace, R: Recorder) -> list:
    """This rank's model chunks of a ``pp * vpp``-layer MLP, laid out as megatron lays out
    virtual stages: chunk ``v`` of pipeline rank ``r`` is layer ``v * pp + r``. The first layer
    takes the micro-batch (4 features), the last gives one value; in between, activations of
    shape [1, micro-batch, 8] travel between ranks. Each chunk records its forward (``mb``,
    ``chunk``), every gradient it accumulates and the end of its backward."""
    layers = args.pp * args.vpp

    class Chunk(torch.nn.Module):
        def __init__(self, vp: int):
            super().__init__()
            index = vp * args.pp + args.rank
            self.config = config
            self.model_type = model_type
            self.vp_stage = vp if args.vpp > 1 else None
            self.pre_process = index == 0
            self.post_process = index == layers - 1
            self.layer_index = index
            self.chunk = vp
            self.fc = torch.nn.Linear(4 if self.pre_process else 8, 1 if self.post_process else 8)
            self.input_tensor = None
            self._pending: list[int] = []
            for param in self.parameters():
                param.register_post_accumulate_grad_hook(self._grad_accumulated)

        def set_input_tensor(self, input_tensor):
            if isinstance(input_tensor, (list, tuple)):
                input_tensor = input_tensor[0]
            self.input_tensor = input_tensor

        def _grad_accumulated(self, param):
            mb = self._pending[0] if self._pending else None
            R.rec("model.grad", chunk=self.chunk, mb=mb)
            self._left -= 1
            if self._left == 0:
                R.rec("model.backward_end", chunk=self.chunk, mb=mb)
                self._pending.pop(0)

        def forward(self, x):
            h = x if self.pre_process else self.input_tensor.reshape(-1, 8)
            out = self.fc(h)
            if not self.post_process:
                out = torch.tanh(out).reshape(1, -1, 8)  # [seq, micro-batch, hidden]
            mb = R.mb
            R.rec("model.forward", chunk=self.chunk, grad_enabled=torch.is_grad_enabled())
            if out.requires_grad:

                def begin(grad, mb=mb):
                    self._pending.append(mb)
                    self._left = sum(1 for _ in self.parameters())
                    R.rec("model.backward_begin", chunk=self.chunk, mb=mb)

                out.register_hook(begin)
            return out

    return [Chunk(vp) for vp in range(args.vpp)]


WORK_EVENTS = {
    "model.forward": "forward",
    "loss": "forward",
    "model.grad": "backward",
    "model.backward_end": "backward",
}


def summarize_pp(events: list[dict], phases: list[str], args: argparse.Namespace) -> dict:
    """What each msprobe step of this rank holds, and whether every micro-batch's work is in one.

    A step is open from ``debugger.start`` to ``debugger.step``; the work events in between
    (a chunk's forward, the loss, the gradients a chunk accumulates, the end of its backward)
    are its content, each tagged with its micro-batch and chunk: a *unit*."""
    steps: list[dict] = []
    outside: list[dict] = []
    current = None
    for i, e in enumerate(events):
        kind = e["event"]
        if kind == "debugger.start" and current is None:
            current = {"opened": i, "call": e["call"], "units": {}, "work": []}
        elif kind == "debugger.step" and current is not None:
            current.update(closed=i, step=e["current_iter"])
            steps.append(current)
            current = None
        elif kind in WORK_EVENTS:
            unit = (e["call"], e["mb"], e.get("chunk"))
            if current is None:
                outside.append(
                    {"seq": e["seq"], "event": kind, "call": e["call"], "mb": e["mb"], "chunk": e.get("chunk")}
                )
            else:
                passes = current["units"].setdefault(unit, [])
                if WORK_EVENTS[kind] not in passes:
                    passes.append(WORK_EVENTS[kind])
                current["work"].append(i)
    units = sorted({(e["call"], e["mb"], e.get("chunk")) for e in events if e["event"] == "model.forward"})
    per_unit = []
    for call, mb, chunk in units:
        mine = [s for s in steps if (call, mb, chunk) in s["units"]]
        forward_end = max(
            i
            for i, e in enumerate(events)
            if e["event"] in ("model.forward", "loss") and (e["call"], e["mb"], e.get("chunk")) == (call, mb, chunk)
        )
        bwd_end = next(
            (
                i
                for i, e in enumerate(events)
                if e["event"] == "model.backward_end" and (e["call"], e["mb"], e.get("chunk")) == (call, mb, chunk)
            ),
            None,
        )
        last = bwd_end if bwd_end is not None else forward_end
        # the next thing the schedule does on this rank after this unit's last work
        next_action = next(
            (i for i in range(last + 1, len(events)) if events[i]["event"] in ("batch_taken", "model.backward_begin")),
            len(events),
        )
        closing = next((s for s in mine if s["opened"] <= last <= s["closed"]), None)
        per_unit.append(
            {
                "call": call,
                "phase": phases[call],
                "mb": mb,
                "chunk": chunk,
                "steps": [s["step"] for s in mine],
                "passes": [s["units"][(call, mb, chunk)] for s in mine],
                "backward_seen": bwd_end is not None,
                # the step holding the unit's last work closes after it, before the schedule moves on
                "closed_after_last_work": closing is not None and closing["closed"] > last,
                "closed_before_next_action": closing is not None and closing["closed"] < next_action,
            }
        )
    dump_path = dump_path_from_env(args)
    rank_dir = f"rank{args.rank}"
    dumped = {}
    if dump_path and os.path.isdir(dump_path):
        for step_dir in glob.glob(os.path.join(dump_path, "step*")):
            number = step_dir.rsplit("step", 1)[1]
            dump_json = os.path.join(step_dir, rank_dir, "dump.json")
            if number.isdigit() and os.path.isfile(dump_json):
                try:
                    data = json.loads(Path(dump_json).read_text()).get("data", {})
                except ValueError:
                    data = {}
                dumped[int(number)] = {
                    "data_keys": len(data),
                    "forward_keys": sum(1 for k in data if ".forward" in k),
                    "backward_keys": sum(1 for k in data if ".backward" in k),
                }
    log_path = os.path.join(dump_path, str(os.getpid()), "update_actor_log.jsonl") if dump_path else None
    log_lines = []
    if log_path and os.path.isfile(log_path):
        log_lines = [json.loads(line) for line in Path(log_path).read_text().splitlines() if line.strip()]
    by_step = {line.get("step"): line for line in log_lines}
    step_rows = []
    for s in steps:
        (unit, passes), *more = list(s["units"].items()) or [((None, None, None), [])]
        line = by_step.get(s["step"], {})
        step_rows.append(
            {
                "step": s["step"],
                "call": s["call"],
                "units": [list(u) for u in s["units"]],
                "passes": passes,
                "dump": dumped.get(s["step"]),
                "log": {k: line.get(k) for k in ("micro_batch", "vp_stage", "pp_rank", "phase", "passes", "rank")}
                if line
                else None,
                "log_matches": bool(line)
                and not more
                and line.get("micro_batch") == unit[1]
                and line.get("passes") == passes
                and line.get("phase") == phases[s["call"]]
                and line.get("pp_rank") == args.rank
                and line.get("vp_stage") == (unit[2] if args.vpp > 1 else None),
            }
        )
    dumped_calls = {s["call"] for s in steps}
    checks = {
        "dumped": bool(steps),
        "one_unit_per_step": bool(steps) and all(len(s["units"]) == 1 for s in steps),
        "no_work_outside_steps": not [o for o in outside if o["call"] in dumped_calls],
        "every_unit_dumped": bool(per_unit) and all(u["steps"] for u in per_unit if u["call"] in dumped_calls),
        "backward_in_a_step": all(
            any("backward" in p for p in u["passes"])
            for u in per_unit
            if u["call"] in dumped_calls and u["backward_seen"]
        ),
        "closed_after_last_work": all(u["closed_after_last_work"] for u in per_unit if u["call"] in dumped_calls),
        "closed_before_next_action": all(u["closed_before_next_action"] for u in per_unit if u["call"] in dumped_calls),
        "one_step_per_unit": all(len(u["steps"]) == 1 for u in per_unit if u["call"] in dumped_calls),
        "dump_json_per_step": bool(steps) and all(r["dump"] and r["dump"]["data_keys"] > 0 for r in step_rows),
        "log_line_per_step": sorted(line.get("step") for line in log_lines) == sorted(s["step"] for s in steps),
        "log_lines_match": bool(step_rows) and all(r["log_matches"] for r in step_rows),
        "steps_distinct": len({s["step"] for s in steps}) == len(steps),
    }
    return {
        "pp_steps": step_rows,
        "per_unit": per_unit,
        "work_outside_steps": outside,
        "update_actor_log": {"path": log_path, "lines": log_lines},
        "checks": checks,
    }


# --------------------------------------------------------------------------- CLI


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patched-file", type=Path, help="a patched verl megatron transformer_impl.py")
    parser.add_argument(
        "--phase-run",
        choices=["log_prob", "update_actor", "both"],
        default="update_actor",
        help="log_prob: forward_only=True under no_grad; update_actor: forward_only=False + optimizer step; "
        "both: calls alternate log_prob, update_actor",
    )
    parser.add_argument("--micro-batches", type=int, default=2)
    parser.add_argument("--micro-batch-size", type=int, default=2)
    parser.add_argument("--calls", type=int, default=1, help="forward_backward_batch calls to make")
    parser.add_argument(
        "--per-token-loss",
        action="store_true",
        help="calculate_per_token_loss=True: exercise the hooked 3-value return",
    )
    parser.add_argument("--batch-kind", choices=["auto", "tensordict", "dict"], default="auto")
    parser.add_argument(
        "--v1-batch",
        action="store_true",
        help="V1-trainer-shaped micro-batches: request ids only in each sample's extra_fields, padding samples "
        "(see make_v1_batch)",
    )
    parser.add_argument("--dump-path", type=Path, help="where msprobe dumps (default: read from $MSPROBE_ACTOR_CONFIG)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--pp", type=int, default=1, help="pipeline-parallel size (one process per stage)")
    parser.add_argument("--vpp", type=int, default=1, help="virtual pipeline size: model chunks per rank")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--store", type=Path, help="file:// rendezvous shared by the ranks (--world-size > 1)")
    parser.add_argument("--out", type=Path, help="result JSON")
    parser.add_argument(
        "--write-config",
        type=Path,
        metavar="PATH",
        help="only write a minimal msprobe config (needs --dump-path) and exit",
    )
    parser.add_argument(
        "--extract-only", action="store_true", help="only extract the hook code (stdlib only) and write it to --out"
    )
    args = parser.parse_args(argv)
    if args.write_config:
        if not args.dump_path:
            parser.error("--write-config needs --dump-path")
    elif not args.patched_file or not args.out:
        parser.error("--patched-file and --out are required")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.write_config:
        write_msprobe_config(args.write_config, args.dump_path)
        return 0
    if args.extract_only:
        try:
            payload = {"ok": True, "extracted": extract_hooks(args.patched_file)}
            payload["standin_source"] = build_standin_source(payload["extracted"])
        except ExtractError as exc:
            payload = {"ok": False, "error": f"ExtractError: {exc}"}
        Path(args.out).write_text(json.dumps(payload, indent=2))
        return 0 if payload["ok"] else 1
    result = {
        "ok": False,
        "error": None,
        "phase_run": args.phase_run,
        "forward_only": args.phase_run == "log_prob",
        "micro_batches": args.micro_batches,
        "micro_batch_size": args.micro_batch_size,
        "calls": args.calls,
        "per_token_loss": args.per_token_loss,
        "v1_batch": args.v1_batch,
        "rank": args.rank,
        "pp": args.pp,
        "vpp": args.vpp,
        "msprobe_env": {name: os.environ.get(name) for name in MSPROBE_SWITCHES},
        "timings_s": {},
    }
    t = time.perf_counter()
    code = 0
    try:
        run(args, result)
        result["ok"] = True
    except ExtractError as exc:
        result["error"] = f"ExtractError: {exc}"
        code = 2
    except BaseException:
        result["error"] = traceback.format_exc()
        code = 1
    result["timings_s"]["total"] = round(time.perf_counter() - t, 3)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2, default=str))
    return code


if __name__ == "__main__":
    sys.exit(main())
