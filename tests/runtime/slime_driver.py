"""Run slime's real patched `forward_only` and `train_one_step` under megatron-core's real schedule, on the CPU.

Run it with the python of the megatron venv (``megatron_venv.md``), not pytest's::

    <venv>/bin/python tests/runtime/slime_driver.py --slime-root <checkout> --out result.json

Real: slime's `slime/backends/megatron_utils/model.py` as rlprobe-patch left it, imported as a
module of the checkout (with its real `data.py` / `get_batch`, `DataIterator`, `loss.py` /
`loss_function` (`--loss-type sft_loss`) and `get_log_probs_and_entropy`, `cp_utils.py`);
megatron-core 0.16.1's `get_forward_backward_func()` (`forward_backward_no_pipelining` after
`initialize_model_parallel(1, 1)` on a one-process gloo group); msprobe's `PrecisionDebugger`;
torch autograd.

Stand-ins, and why:

* `megatron.training` (not in megatron-core's wheel): a stub package holding only the names
  slime's modules import from it; `get_args()` returns the driver's `args`, every other name
  raises if called (none is, on this path).
* the accelerator: slime's `get_batch` moves `cu_seqlens` with `.cuda()` /
  `torch.cuda.current_device()`, and megatron-core's schedule allocates one counter on "cuda";
  on this CPU build `Tensor.cuda` returns the tensor, `torch.cuda.current_device()` is "cpu"
  and the schedule's `torch.zeros(..., device="cuda")` is made on the CPU. The patch's own code
  calls no accelerator.
* the model: a toy causal LM (embedding, linear) taking slime's keyword arguments and returning
  logits `[1, T, V]`; it carries a `TransformerConfig`, `model_type`, `set_input_tensor` and
  `zero_grad_buffer` as megatron's DDP chunk does; the optimizer is SGD behind the
  `zero_grad()` / `step() -> (ok, grad_norm, zeros)` of a `MegatronOptimizer`.

The run: one actor log-prob pass (`forward_only`), one reference pass (`store_prefix="ref_"`),
one training step (`train_one_step`), over `--samples` samples in micro-batches given by
`micro_batch_indices` (slime's dynamic-batch schedule). Output JSON: the losses, log-probs,
events (micro-batch taken, backward finished, step closed) and the `update_actor_log.jsonl`
lines and msprobe step folders found.
"""

from __future__ import annotations

import argparse
import glob
import importlib.machinery
import json
import os
import sys
import traceback
import types
from pathlib import Path

STANDINS = [
    "megatron.training: a stub package holding only the names slime imports from it (get_args returns the "
    "driver's args; nothing else is called)",
    "accelerator: Tensor.cuda() returns the tensor and torch.cuda.current_device() is 'cpu' (slime's get_batch); "
    "megatron-core's schedule allocates total_num_tokens on the CPU instead of 'cuda'",
    "model: a toy causal LM with a TransformerConfig (no GPTModel, no megatron DDP); optimizer: SGD",
]
STUBBED: list[str] = []  # every megatron.training name slime's modules took from the stub


class _StubModule(types.ModuleType):
    """A module whose every public name is a function that raises when called (recorded in STUBBED)."""

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        full = f"{self.__name__}.{attr}"
        STUBBED.append(full)

        def not_on_this_path(*a, **k):
            raise NotImplementedError(f"{full} is a stub of the driver (megatron.training is not in megatron-core)")

        setattr(self, attr, not_on_this_path)
        return not_on_this_path


class _StubFinder:
    """Finds `megatron.training` and its submodules as stub modules."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "megatron.training" or name.startswith("megatron.training."):
            return importlib.machinery.ModuleSpec(name, _StubFinder, is_package=True)
        return None

    @staticmethod
    def create_module(spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    @staticmethod
    def exec_module(module):
        pass


def install_megatron_training_stub(args: argparse.Namespace) -> None:
    sys.meta_path.insert(0, _StubFinder)  # type: ignore[arg-type]
    import megatron.training.global_vars as global_vars

    global_vars.get_args = lambda: args  # type: ignore[attr-defined]
    STUBBED.append("megatron.training.global_vars.get_args (returns the driver's args)")


# Third-party packages slime's modules import at module level for logging and serving; stubbed
# only when the venv lacks them (nothing of theirs is called on the driver's path).
THIRD_PARTY = ("wandb", "httpx", "ray", "pybase64", "sglang", "transformers")


def install_third_party_stubs() -> list[str]:
    import importlib.util

    stubbed = []
    for name in THIRD_PARTY:
        if importlib.util.find_spec(name) is not None:
            continue
        module = types.ModuleType(name)
        module.__path__ = []

        def attribute(attr: str, name: str = name):
            if attr.startswith("__"):
                raise AttributeError(attr)
            return type(attr, (), {"__init__": lambda self, *a, **k: None, "__module__": name})

        module.__getattr__ = attribute  # type: ignore[method-assign]
        sys.modules[name] = module
        stubbed.append(name)
    return stubbed


def cpu_accelerator() -> None:
    import torch

    torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    import megatron.core.pipeline_parallel.schedules as schedules

    class _Torch:
        def __getattr__(self, name):
            return getattr(torch, name)

        @staticmethod
        def zeros(*a, **k):
            if k.get("device") == "cuda":
                k["device"] = "cpu"
            return torch.zeros(*a, **k)

    schedules.torch = _Torch()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--slime-root")
    parser.add_argument("--out")
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--workdir", default=".")
    parser.add_argument("--write-config", metavar="PATH", help="write a minimal msprobe config and exit")
    parser.add_argument("--dump-path", metavar="DIR")
    parser.add_argument(
        "--bad-switches",
        metavar="JSON",
        help="a list of environments, each tried (on top of the run's) with a log-prob pass before the run: "
        "each must stop at the pass's first statement",
    )
    opts = parser.parse_args(argv)
    if opts.write_config:
        config = {"task": "statistics", "dump_path": opts.dump_path, "rank": [], "step": [], "level": "mix"}
        Path(opts.write_config).write_text(json.dumps({**config, "async_dump": False}))
        return 0
    result: dict = {"ok": False, "error": None, "standins": STANDINS, "events": []}
    try:
        run(opts, result)
        result["ok"] = True
    except Exception:
        result["error"] = traceback.format_exc()
    Path(opts.out).write_text(json.dumps(result, indent=1, default=str))
    return 0 if result["ok"] else 1


def slime_args(samples: int) -> argparse.Namespace:
    return argparse.Namespace(
        data_pad_size_multiplier=4,
        allgather_cp=False,
        qkv_format="thd",
        seq_length=32,
        decoder_seq_length=None,
        micro_batch_size=1,
        use_rollout_entropy=False,
        use_dynamic_batch_size=True,
        custom_megatron_before_log_prob_hook_path=None,
        custom_megatron_before_train_step_hook_path=None,
        rollout_top_p=1.0,
        enable_mtp_training=False,
        check_for_nan_in_loss_and_grad=True,
        ci_test=False,
        calculate_per_token_loss=False,
        loss_type="sft_loss",
        recompute_loss_function=False,
        log_probs_chunk_size=-1,
        rollout_temperature=1.0,
        true_on_policy_mode=False,
        global_batch_size=samples,
    )


def run(opts: argparse.Namespace, result: dict) -> None:
    sys.path.insert(0, opts.slime_root)
    args = slime_args(opts.samples)
    install_megatron_training_stub(args)
    result["third_party_stubs"] = install_third_party_stubs()
    result["megatron_training_names"] = STUBBED
    import torch

    cpu_accelerator()
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.enums import ModelType
    from megatron.core.transformer import TransformerConfig

    dist.init_process_group("gloo", init_method=f"file://{Path(opts.workdir).resolve()}/pg", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    from slime.backends.megatron_utils import model as slime_model
    from slime.backends.megatron_utils.data import DataIterator
    from slime.backends.megatron_utils.loss import get_log_probs_and_entropy

    result["model_py"] = slime_model.__file__
    result["patched"] = hasattr(slime_model, "_rlprobe_slime_dump")
    events = result["events"]
    vocab, hidden = 11, 8
    config = TransformerConfig(num_layers=1, hidden_size=hidden, num_attention_heads=1)

    class ToyCausalLM(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = config
            self.model_type = ModelType.encoder_or_decoder
            self.embed = torch.nn.Embedding(vocab, hidden)
            self.head = torch.nn.Linear(hidden, vocab)

        def set_input_tensor(self, tensor) -> None:
            pass

        def zero_grad_buffer(self) -> None:
            self.zero_grad(set_to_none=True)

        def forward(self, input_ids, position_ids=None, attention_mask=None, labels=None, **kwargs):
            events.append({"event": "model.forward", "tokens": int(input_ids.numel())})
            out = self.head(torch.tanh(self.embed(input_ids)))
            if out.requires_grad:
                out.register_hook(lambda g: events.append({"event": "model.backward_begin"}))
            return out

    if os.environ.get("DUMP_ON"):  # observe msprobe's step boundaries (the calls go through unchanged)
        from msprobe.pytorch import PrecisionDebugger

        for method in ("start", "stop", "step"):
            raw = PrecisionDebugger.__dict__[method]
            function = raw.__func__ if isinstance(raw, (classmethod, staticmethod)) else raw

            def observed(*a, _function=function, _method=method, **k):
                events.append({"event": f"debugger.{_method}"})
                return _function(*a, **k)

            setattr(PrecisionDebugger, method, type(raw)(observed) if raw is not function else observed)
    torch.manual_seed(0)
    chunk = ToyCausalLM()
    for param in chunk.parameters():
        param.register_post_accumulate_grad_hook(lambda p: events.append({"event": "model.grad_accumulated"}))
    chunk.role = "actor"
    model = [chunk]
    sgd = torch.optim.SGD(chunk.parameters(), lr=0.1)

    class Optimizer:
        def zero_grad(self):
            sgd.zero_grad(set_to_none=True)

        def step(self):
            norm = torch.nn.utils.clip_grad_norm_(chunk.parameters(), 1e9)
            sgd.step()
            return True, float(norm), 0

    class Scheduler:
        def step(self, increment):
            pass

    gen = torch.Generator().manual_seed(1)
    n = opts.samples
    lengths = [(4 + i % 3, 2 + i % 2) for i in range(n)]  # (total, response)
    tokens = [torch.randint(0, vocab, (t,), generator=gen) for t, _ in lengths]
    micro_batch_indices = [[0, 1], [2], [3, 4]][: max(1, n - 2)] if n == 5 else [[i] for i in range(n)]
    rollout_data = {
        "tokens": tokens,
        "total_lengths": [t for t, _ in lengths],
        "response_lengths": [r for _, r in lengths],
        "loss_masks": [torch.ones(r, dtype=torch.int) for _, r in lengths],
        "sample_indices": [100 + 7 * i for i in range(n)],  # Sample.index: a global counter
        "partition": [3 * i for i in range(n)],
        "rollout_mask_sums": [torch.tensor(float(r)) for _, r in lengths],
        "multimodal_train_inputs": None,
    }
    del rollout_data["multimodal_train_inputs"]
    result["micro_batch_indices"] = micro_batch_indices
    result["sample_indices"] = rollout_data["sample_indices"]

    def iterator():
        import inspect

        params = inspect.signature(DataIterator).parameters
        if "micro_batch_size" in params:  # slime 0.2.x
            return [DataIterator(rollout_data, micro_batch_indices=micro_batch_indices)]
        return [DataIterator(rollout_data, micro_batch_indices)]

    def observe_batches(it):
        original = it.get_next

        def get_next(keys):
            events.append({"event": "batch_taken", "mb": it.offset})
            return original(keys)

        it.get_next = get_next
        return it

    nmb = len(micro_batch_indices)
    its = [observe_batches(i) for i in iterator()]
    if opts.bad_switches:
        result["bad_switches"] = try_bad_switches(
            json.loads(opts.bad_switches), slime_model, args, model, its, nmb, events
        )
    log_probs = slime_model.forward_only(get_log_probs_and_entropy, args, model, its, [nmb])
    events.append({"event": "pass_returned", "pass": "log_prob"})
    result["log_probs"] = [t.tolist() for t in log_probs["log_probs"]]
    ref = slime_model.forward_only(get_log_probs_and_entropy, args, model, its, [nmb], store_prefix="ref_")
    events.append({"event": "pass_returned", "pass": "ref"})
    result["ref_log_probs"] = [t.tolist() for t in ref["ref_log_probs"]]
    for it in its:
        it.reset()
    import inspect

    extra = (
        {"step_global_batch_size": n}
        if "step_global_batch_size" in inspect.signature(slime_model.train_one_step).parameters
        else {}
    )
    out = slime_model.train_one_step(args, 7, 0, its, model, Optimizer(), Scheduler(), nmb, **extra)
    events.append({"event": "pass_returned", "pass": "update_actor"})
    result["train"] = {"losses": repr(out[0]), "grad_norm": out[1]}
    result["params_after"] = float(sum(p.detach().double().sum() for p in chunk.parameters()))
    result["msprobe_imported"] = any(name.startswith("msprobe") for name in sys.modules)
    dump = slime_model.__dict__.get("_rlprobe_slime_dump")
    if dump is not None and dump.debugger is not None:
        path = dump.debugger.config.dump_path
        result["dump_path"] = path
        result["step_dirs"] = sorted(os.path.basename(p) for p in glob.glob(os.path.join(path, "step*")))
        result["log_lines"] = [
            json.loads(line)
            for p in glob.glob(os.path.join(path, "*", "update_actor_log.jsonl"))
            for line in Path(p).read_text().splitlines()
        ]


def try_bad_switches(envs: list[dict], slime_model, args, model, its, nmb, events: list) -> list[dict]:
    """Each environment in turn, with a log-prob pass: the error it stops with, and the events
    (micro-batch taken, model forward, debugger calls) that happened before it: none expected.

    The switches are read once per process (kept in `sys.modules["_rlprobe_patch_run"]`): the
    driver drops that cache around each try, so the run after them reads the process's own."""
    from slime.backends.megatron_utils.loss import get_log_probs_and_entropy

    tried = []
    for env in envs:
        saved = {name: os.environ.get(name) for name in env}
        os.environ.update(env)
        sys.modules.pop("_rlprobe_patch_run", None)
        seen = len(events)
        try:
            slime_model.forward_only(get_log_probs_and_entropy, args, model, its, [nmb])
            error = None
        except ValueError as exc:
            error = str(exc)
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            sys.modules.pop("_rlprobe_patch_run", None)
        tried.append({"env": env, "error": error, "events": events[seen:], "offsets": [it.offset for it in its]})
    return tried


if __name__ == "__main__":
    sys.exit(main())
