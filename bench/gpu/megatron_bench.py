"""verl's real Megatron engine (MegatronEngineWithLMHead, PP=1) on the GPU: dumps, their timing, cost when off.

Run with the python whose `import verl` is the patched tree (bench/gpu/run_gpu.sh)::

    python bench/gpu/megatron_bench.py --mode steps --out r.json --pristine-file F --interleave 20
    DUMP_ON=1 MSPROBE_ACTOR_CONFIG=cfg.json python bench/gpu/megatron_bench.py --mode dump \\
        --dump-phases log_prob,update_actor,all --out r.json

What is real: verl's `EngineRegistry.new(model_type="language_model", backend="megatron")`,
i.e. `MegatronEngineWithLMHead` with `McoreEngineConfig(use_mbridge=True,
vanilla_mbridge=True)` (the `mbridge` package builds megatron-core's `GPTModel` from the HF
config and loads the HF weights), megatron-core's DDP wrapper, its optimizer and its
`get_forward_backward_func()` schedule (PP=1: `forward_backward_no_pipelining`), verl's
`train_batch` / `infer_batch` (zero_grad, `forward_backward_batch`, optimizer step; the
log-prob pass under `torch.no_grad()`), with verl's `sft_loss`; a random-weight Qwen2
saved with a word-level tokenizer (verl reads `pad_token_id` from it).

One substitution, recorded in the result (`workarounds`): mbridge asks megatron-core for
the Transformer Engine layer spec (`get_gpt_decoder_block_spec(config,
use_transformer_engine=True)`), and Transformer Engine is not in the device image (nor
installable there: no network, and its wheels exceed what a call may carry). When
`import transformer_engine` fails, the driver wraps that one function (as imported by
mbridge) to pass `use_transformer_engine=False`, which gives megatron-core's own local
spec (its ColumnParallelLinear/RowParallelLinear, DotProductAttention, torch norms).
Everything else is as verl runs it. The local DotProductAttention cannot take packed
sequences, so the engine runs with `use_remove_padding=False` (verl's BSHD path).

Observation only (no behaviour changed): a wrapper on the engine instance's
`forward_step` (records when the schedule hands a micro-batch over) and on
`_finish_dump_step` (records when a dump step closes and whether one was open); a
forward hook on the word embedding that registers a gradient hook on its output (the
last activation gradient of the backward pass), and a post-accumulate-grad hook on the
embedding weight (the last gradient the backward pass produces).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import socket
import statistics
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tests" / "runtime"))
sys.path.insert(0, str(HERE))
CHECKPOINT = lambda: None  # noqa: E731  (main() points it at save())
SWITCHES = ("DUMP_ON", "DUMP_PHASE", "MSPROBE_ACTOR_CONFIG")
PATCHED_METHODS = ("forward_backward_batch", "forward_step", "postprocess_micro_batch_func")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=["steps", "dump"], required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--model-dir", type=Path, default=Path("/tmp/rlprobe-bench/qwen2-mcore"))
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--intermediate", type=int, default=2816)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--seq-min", type=int, default=384)
    p.add_argument("--seq-max", type=int, default=512)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--micro-batches", type=int, default=4)
    p.add_argument("--micro-batch-size", type=int, default=4)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--pristine-file", type=Path)
    p.add_argument("--interleave", type=int, default=0)
    p.add_argument("--dump-phases", default="log_prob")
    p.add_argument("--interleave-budget", type=float, default=None, help="stop the ABBA rounds after this many seconds")
    p.add_argument(
        "--interleave-nondeterministic",
        action="store_true",
        help="switch torch's deterministic algorithms off for the interleaved rounds",
    )
    p.add_argument(
        "--then-dump",
        default=None,
        metavar="PHASES",
        help="steps mode: afterwards set DUMP_ON=1 in this process and run --mode dump for PHASES",
    )
    p.add_argument("--deterministic", type=int, default=1)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--seed", type=int, default=1234)
    return p.parse_args(argv)


class Recorder:
    def __init__(self):
        self.events = []
        self.t0 = time.perf_counter()

    def rec(self, event, **detail):
        self.events.append(
            {"seq": len(self.events), "event": event, "t_ms": round((time.perf_counter() - self.t0) * 1e3, 3), **detail}
        )

    def take(self):
        ev, self.events = self.events, []
        return ev


def prepare_environment(use_cuda):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("TOKENIZERS_PARALLELISM", "false")):
        os.environ.setdefault(k, v)
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")  # what megatron asks for with TP/SP overlap
    if not use_cuda:
        import cpu_dryrun  # bench/gpu: a CPU dry run only (see that file)

        cpu_dryrun.install()
        modules = [m for m in os.environ.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m]
        if "cpu_platform" not in modules:
            modules.insert(0, "cpu_platform")
        os.environ["VERL_USE_EXTERNAL_MODULES"] = ",".join(modules)
        os.environ["VERL_ENGINE_DEVICE"] = "cuda"


def ensure_model(args):
    import torch
    from tokenizers import Tokenizer, models
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config

    cfg = dict(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        architectures=["Qwen2ForCausalLM"],
        torch_dtype="bfloat16",
    )
    if not (args.model_dir / "config.json").is_file():
        torch.manual_seed(args.seed)
        model = AutoModelForCausalLM.from_config(Qwen2Config(**cfg), torch_dtype=torch.bfloat16)
        staging = args.model_dir.parent / f".{args.model_dir.name}.{os.getpid()}"
        model.save_pretrained(staging)
        vocab = {f"t{i}": i for i in range(args.vocab)}
        tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
        PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="t0", eos_token="t1", unk_token="t0").save_pretrained(
            staging
        )
        args.model_dir.parent.mkdir(parents=True, exist_ok=True)
        os.rename(staging, args.model_dir)
    digest = hashlib.sha256()
    for path in sorted(args.model_dir.glob("*.safetensors")):
        digest.update(path.read_bytes())
    return {"config": cfg, "sha256": digest.hexdigest()}


def force_local_spec_if_no_te(result):
    """mbridge asks for Transformer Engine's layer spec; without TE, ask for megatron-core's local one."""
    try:
        import transformer_engine  # noqa: F401

        result["transformer_engine"] = importlib.metadata.version("transformer_engine")
        return
    except Exception as exc:  # ImportError, or a broken install
        result["transformer_engine"] = f"absent ({type(exc).__name__}: {exc})"
    import mbridge.core.llm_bridge as llm_bridge

    original = llm_bridge.get_gpt_decoder_block_spec

    def local_block_spec(config, *args, **kwargs):
        kwargs["use_transformer_engine"] = False
        return original(config, *args, **kwargs)

    llm_bridge.get_gpt_decoder_block_spec = local_block_spec

    # The local spec keeps the two RMSNorms as modules of their own (`input_layernorm`,
    # `pre_mlp_layernorm`) where TE fuses them into the next linear (`layer_norm_weight`);
    # mbridge's HF-name table knows only the TE names, so give it those.
    from mbridge.core.bridge import Bridge

    original_mapping = Bridge._weight_name_mapping_mcore_to_hf
    renames = {
        ".input_layernorm.weight": ".self_attention.linear_qkv.layer_norm_weight",
        ".pre_mlp_layernorm.weight": ".mlp.linear_fc1.layer_norm_weight",
    }

    def mapping(self, mcore_weights_name):
        for local, te in renames.items():
            if mcore_weights_name.endswith(local):
                mcore_weights_name = mcore_weights_name[: -len(local)] + te
        return original_mapping(self, mcore_weights_name)

    Bridge._weight_name_mapping_mcore_to_hf = mapping
    result.setdefault("workarounds", []).extend(
        [
            "mbridge.core.llm_bridge.get_gpt_decoder_block_spec wrapped to pass use_transformer_engine=False "
            "(Transformer Engine absent): megatron-core's local layer spec",
            "mbridge.core.bridge.Bridge._weight_name_mapping_mcore_to_hf wrapped to map the local spec's "
            "'input_layernorm.weight'/'pre_mlp_layernorm.weight' to the TE names it knows "
            "('self_attention.linear_qkv.layer_norm_weight'/'mlp.linear_fc1.layer_norm_weight')",
        ]
    )


def adapt_padding_mask_for_local_spec(engine, result):
    """verl's BSHD path hands GPTModel a [batch, seq] mask, True on real tokens, which TE's attention
    takes; megatron-core's local DotProductAttention wants a [batch, 1, seq, seq] mask, True where a
    score is masked out, and applies no causal mask of its own once a mask is given. A forward
    pre-hook on the (unwrapped) GPTModel turns the first into the second: causal and padding."""
    if not str(result.get("transformer_engine", "")).startswith("absent"):
        return
    import torch
    from megatron.core.utils import unwrap_model

    def pre_hook(module, args, kwargs):
        mask = kwargs.get("attention_mask")
        if isinstance(mask, torch.Tensor) and mask.dim() == 2 and mask.dtype == torch.bool:
            s = mask.shape[1]
            causal = torch.ones(s, s, dtype=torch.bool, device=mask.device).tril_()
            allowed = causal[None, None, :, :] & mask[:, None, None, :]
            kwargs["attention_mask"] = ~allowed
        return args, kwargs

    for chunk in engine.module:
        unwrap_model(chunk).register_forward_pre_hook(pre_hook, with_kwargs=True)
    result.setdefault("workarounds", []).append(
        "forward pre-hook on the unwrapped GPTModel: verl's [batch, seq] padding mask (True = token) "
        "turned into the [batch, 1, seq, seq] causal+padding mask (True = masked) that megatron-core's "
        "local DotProductAttention expects (TE's attention takes the former)"
    )


def build_engine(args):
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import HFModelConfig, McoreEngineConfig, McoreOptimizerConfig
    from verl.workers.engine import EngineRegistry

    model_config = HFModelConfig(path=str(args.model_dir), load_tokenizer=True)
    engine_config = McoreEngineConfig(
        forward_only=False,
        use_mbridge=True,
        vanilla_mbridge=True,
        tensor_model_parallel_size=1,
        pipeline_model_parallel_size=1,
        context_parallel_size=1,
        use_remove_padding=False,
        use_dynamic_bsz=False,
        micro_batch_size_per_gpu=args.micro_batch_size,
        dtype=args.dtype,
        seed=args.seed,
    )
    optimizer_config = McoreOptimizerConfig(lr=1e-5, lr_decay_steps=10_000)
    return EngineRegistry.new(
        model_type="language_model",
        backend="megatron",
        model_config=model_config,
        engine_config=engine_config,
        optimizer_config=optimizer_config,
        checkpoint_config=CheckpointConfig(),
    )


def make_samples(args):
    import torch

    g = torch.Generator().manual_seed(args.seed)
    samples = []
    for i in range(args.micro_batches * args.micro_batch_size):
        length = int(torch.randint(args.seq_min, args.seq_max + 1, (1,), generator=g))
        ids = torch.randint(2, args.vocab, (length,), generator=g)
        mask = torch.ones(length, dtype=torch.long)
        mask[: args.prompt_len] = 0
        samples.append({"request_id": f"req-{i}", "input_ids": ids, "loss_mask": mask})
    return samples


def batch_factory(samples, args):
    from fsdp_driver import make_batch  # tests/runtime: verl's no-padding TensorDict layout

    ns = argparse.Namespace(remove_padding=False, micro_batch_size=args.micro_batch_size)
    return lambda: make_batch(samples, ns)


def install_wrappers(engine, recorder):
    """Observation-only wrappers on the engine instance (module docstring); repeatable."""
    import torch

    if "forward_step" not in vars(engine):
        engine._observed_forward_step = type(engine).forward_step.__get__(engine)

        def forward_step(batch_iter, model, *a, **k):
            recorder.rec("forward_step_called")
            return engine._observed_forward_step(batch_iter, model, *a, **k)

        engine.forward_step = forward_step

    if hasattr(type(engine), "_finish_dump_step") and "_finish_dump_step" not in vars(engine):
        orig_finish = type(engine)._finish_dump_step.__get__(engine)

        def finish(*args):
            open_step = getattr(engine, "_dump_micro_batch", None)
            if isinstance(open_step, dict) and "passes" in open_step:
                open_step = open_step["batch"]  # revision 2 keeps the open step's micro-batch in a unit
            # revision 2: a callback closes only its own step (`unit`), when it is the open one
            active = open_step is not None and (not args or args[0] is getattr(engine, "_dump_micro_batch", None))
            ids = None
            if active:
                try:  # as the hook reads them (NonTensorStack.tolist())
                    raw = open_step.get("request_id")
                    ids = [str(i) for i in (raw.tolist() if hasattr(raw, "tolist") else raw)]
                except Exception:
                    ids = None
            recorder.rec("finish_dump_step", active=active, request_ids=ids, grad_enabled=torch.is_grad_enabled())
            return orig_finish(*args)

        engine._finish_dump_step = finish


def install_observers(engine, recorder):
    """The wrappers, plus hooks on the word embedding (installed once)."""
    install_wrappers(engine, recorder)
    from megatron.core.utils import unwrap_model

    model = unwrap_model(engine.module[0])
    emb = model.embedding.word_embeddings

    def on_emb_forward(module, inputs, output):
        if output.requires_grad:
            output.register_hook(lambda g: recorder.rec("backward.embedding_output_grad"))
        recorder.rec("forward.embedding")

    emb.register_forward_hook(on_emb_forward)
    weight = emb.weight
    if hasattr(weight, "register_post_accumulate_grad_hook"):
        weight.register_post_accumulate_grad_hook(lambda p: recorder.rec("backward.embedding_weight_grad"))
    return {"embedding": type(emb).__name__, "model": type(model).__name__}


def remove_wrappers(engine):
    for name in ("forward_step", "_finish_dump_step"):
        if name in vars(engine):
            delattr(engine, name)


def load_pristine_methods(pristine_file):
    from verl.workers.engine.base import EngineRegistry

    name = "verl.workers.engine.megatron._rlprobe_bench_pristine_impl"
    spec = importlib.util.spec_from_file_location(name, pristine_file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    descriptor = EngineRegistry.__dict__["register"]
    EngineRegistry.register = classmethod(lambda cls, *a, **k: lambda engine_class: engine_class)
    try:
        spec.loader.exec_module(module)
    finally:
        EngineRegistry.register = descriptor
    src = Path(pristine_file).read_text()
    if "_dump_should_record" in src:
        raise RuntimeError(f"{pristine_file} holds rlprobe-patch code")
    cls = module.MegatronEngineWithLMHead
    return {m: getattr(cls, m) for m in PATCHED_METHODS}


def sft(model_output, data, dp_group=None):
    from verl.workers.utils.losses import sft_loss

    return sft_loss(config=None, model_output=model_output, data=data, dp_group=dp_group)


def scalar(x):
    try:
        import torch

        if isinstance(x, torch.Tensor):
            return float(x.detach().float().mean())
        if isinstance(x, (list, tuple)) and x:
            return [scalar(v) for v in x]
        return float(x)
    except Exception:
        return repr(x)[:80]


class Stepper:
    def __init__(self, engine, new_batch, sync):
        self.engine, self.new_batch, self.sync = engine, new_batch, sync

    def train(self):
        e = self.engine
        self.sync()
        t0, c0 = time.perf_counter(), time.process_time()
        with e.train_mode():
            out = e.train_batch(self.new_batch(), loss_function=sft)
            e.lr_scheduler_step()
        self.sync()
        self.last_cpu_s = time.process_time() - c0  # CPU time of this process (all threads)
        return time.perf_counter() - t0, out

    def log_prob(self):
        e = self.engine
        self.sync()
        t0, c0 = time.perf_counter(), time.process_time()
        with e.eval_mode():
            out = e.infer_batch(self.new_batch(), loss_function=None)
        self.sync()
        self.last_cpu_s = time.process_time() - c0  # CPU time of this process (all threads)
        return time.perf_counter() - t0, out


def summarize_train_output(out):
    if not isinstance(out, dict):
        return {"type": str(type(out))}
    summary = {k: scalar(v) for k, v in out.get("metrics", {}).items()}
    if "loss" in out:
        summary["loss"] = scalar(out["loss"])
    return summary


def log_probs_digest(out):
    import torch

    try:
        lp = out["model_output"]["log_probs"]
    except Exception as exc:
        return {"error": repr(exc)[:200], "keys": list(out.keys()) if isinstance(out, dict) else str(type(out))}
    values = (lp.values() if lp.is_nested else lp).detach().to(torch.float32).contiguous().cpu()
    return {"sha256": hashlib.sha256(values.numpy().tobytes()).hexdigest(), "sum": float(values.sum())}


def med(xs):
    return statistics.median(xs) if xs else None


def run_steps(args, result, engine, stepper, recorder):
    steps = []
    result["steps"] = steps
    for i in range(args.steps):
        t_train, out = stepper.train()
        c_train = stepper.last_cpu_s
        ev_train = recorder.take()
        t_lp, lp = stepper.log_prob()
        ev_lp = recorder.take()
        steps.append(
            {
                "step": i,
                "metrics": summarize_train_output(out),
                "log_probs": log_probs_digest(lp),
                "train_s": round(t_train, 6),
                "log_prob_s": round(t_lp, 6),
                "train_cpu_s": round(c_train, 4),
                "log_prob_cpu_s": round(stepper.last_cpu_s, 4),
                "forward_steps": [sum(e["event"] == "forward_step_called" for e in ev) for ev in (ev_train, ev_lp)],
                "finish_events": [sum(e["event"] == "finish_dump_step" for e in ev) for ev in (ev_train, ev_lp)],
            }
        )
        print(
            f"step {i}: train {t_train * 1e3:.1f} ms (cpu {c_train:.2f} s), log_prob {t_lp * 1e3:.1f} ms, "
            f"metrics {steps[-1]['metrics']}"
        )
    timed = steps[args.warmup :]
    result["median_train_s"] = med([s["train_s"] for s in timed])
    result["median_log_prob_s"] = med([s["log_prob_s"] for s in timed])
    CHECKPOINT()
    if args.pristine_file and args.interleave:
        remove_wrappers(engine)
        pristine = load_pristine_methods(args.pristine_file)
        cls = type(engine)
        patched = {m: getattr(cls, m) for m in PATCHED_METHODS}
        if patched["forward_backward_batch"].__code__.co_code == pristine["forward_backward_batch"].__code__.co_code:
            raise RuntimeError("forward_backward_batch is the same in both trees: is the tree patched?")
        variants = {"pristine": pristine, "patched": patched}
        times = {v: {"train": [], "log_prob": []} for v in variants}
        import torch

        if args.interleave_nondeterministic:
            torch.use_deterministic_algorithms(False)
        started = time.perf_counter()
        rounds = 0
        for r in range(args.interleave):
            if args.interleave_budget and r % 2 == 0 and time.perf_counter() - started > args.interleave_budget:
                break  # whole ABBA blocks only
            rounds += 1
            for v in ("pristine", "patched") if r % 2 == 0 else ("patched", "pristine"):
                for m, fn in variants[v].items():
                    setattr(engine, m, fn.__get__(engine))
                t_train, _ = stepper.train()
                t_lp, _ = stepper.log_prob()
                times[v]["train"].append(t_train)
                times[v]["log_prob"].append(t_lp)
        for m in PATCHED_METHODS:
            delattr(engine, m)
        inter = {
            "rounds": rounds,
            "pattern": "ABBA",
            "raw_s": times,
            "deterministic": torch.are_deterministic_algorithms_enabled(),
        }
        for kind in ("train", "log_prob"):
            mp, mu = med(times["patched"][kind]), med(times["pristine"][kind])
            inter[f"median_{kind}_s"] = {"patched": mp, "pristine": mu}
            inter[f"ratio_{kind}"] = mp / mu
            inter[f"paired_ratio_median_{kind}"] = med(
                [p / u for p, u in zip(times["patched"][kind], times["pristine"][kind])]
            )
        result["interleaved"] = inter
        print(
            f"interleaved {rounds} rounds: train ratio {inter['ratio_train']:.4f} "
            f"(paired {inter['paired_ratio_median_train']:.4f}), log_prob ratio {inter['ratio_log_prob']:.4f} "
            f"(paired {inter['paired_ratio_median_log_prob']:.4f})"
        )


def read_dump(dump_path):
    steps = {}
    for step_dir in sorted(dump_path.glob("step*"), key=lambda p: int(p.name[4:])):
        rank_dirs = sorted(p.name for p in step_dir.iterdir() if p.is_dir())
        data = {}
        files = []
        for rd in rank_dirs:
            files += sorted(p.name for p in (step_dir / rd).glob("*"))
            if (step_dir / rd / "dump.json").is_file():
                data.update(json.loads((step_dir / rd / "dump.json").read_text()).get("data", {}))
        steps[int(step_dir.name[4:])] = {
            "rank_dirs": rank_dirs,
            "files": files,
            "data_keys": len(data),
            "backward_keys": sum(".backward" in k for k in data),
            "module_keys": sum(k.startswith("Module.") for k in data),
            "sample_keys": sorted(data)[:4],
        }
    logs = sorted(dump_path.glob("*/update_actor_log.jsonl"))
    lines = [json.loads(x) for p in logs for x in p.read_text().splitlines() if x.strip()]
    return steps, lines, [str(p) for p in logs]


def analyse_call(events, kind, expected_ids):
    """Per micro-batch: did a dump step open and close, and (training) after its backward?"""
    per_mb = []
    fs_idx = [i for i, e in enumerate(events) if e["event"] == "forward_step_called"]
    for n, start in enumerate(fs_idx):
        end = fs_idx[n + 1] if n + 1 < len(fs_idx) else len(events)
        window = events[start:end]
        finishes = [e for e in window if e["event"] == "finish_dump_step" and e["active"]]
        entry = {"mb": n, "closed_in_own_window": len(finishes) == 1}
        if finishes:
            fin = finishes[0]
            entry["request_ids"] = fin.get("request_ids")
            before = [e["event"] for e in window if e["seq"] < fin["seq"]]
            entry["events_before_finish"] = before
            if kind == "train":
                entry["finished_after_embedding_output_grad"] = "backward.embedding_output_grad" in before
                entry["finished_after_embedding_weight_grad"] = (
                    "backward.embedding_weight_grad" in before
                    if any(e["event"] == "backward.embedding_weight_grad" for e in events)
                    else None
                )
        per_mb.append(entry)
    return per_mb


def run_dump(args, result, engine, stepper, recorder, expected_ids):
    if not os.environ.get("DUMP_ON"):
        raise RuntimeError("--mode dump needs DUMP_ON=1")
    dump_path = Path(json.loads(Path(os.environ["MSPROBE_ACTOR_CONFIG"]).read_text())["dump_path"])
    n_mb = args.micro_batches
    calls, expect, next_step = [], {}, 0

    def check(final):
        steps, lines, log_paths = read_dump(dump_path)
        result["calls"] = calls
        result["dump"] = {
            "dump_path": str(dump_path),
            "steps": {str(k): v for k, v in steps.items()},
            "log_paths": log_paths,
            "log_lines": lines,
        }
        result["expected_steps"] = {str(k): v for k, v in expect.items()}
        train_mbs = [m for c in calls if c["kind"] == "train" for m in c["per_micro_batch"]]
        checks = {
            "step_dirs_match": sorted(steps) == sorted(expect),
            "dump_json_every_step": all("dump.json" in steps[s]["files"] for s in steps),
            "closed_once_per_micro_batch": all(c["active_finishes"] == len(c["expected_steps"]) for c in calls)
            and all(m["closed_in_own_window"] for c in calls for m in c["per_micro_batch"]),
            "train_closed_after_backward": bool(train_mbs)
            and all(m.get("finished_after_embedding_output_grad") for m in train_mbs)
            and all(m.get("finished_after_embedding_weight_grad") in (True, None) for m in train_mbs),
            "train_steps_have_backward": all(
                steps.get(s, {}).get("backward_keys", 0) > 0 for s, e in expect.items() if e["kind"] == "train"
            ),
            "log_prob_steps_have_no_backward": all(
                steps.get(s, {}).get("backward_keys", 1) == 0 for s, e in expect.items() if e["kind"] == "log_prob"
            ),
            "modules_recorded": all(steps[s]["module_keys"] > 0 for s in steps),
            "one_log_line_per_step": [x["step"] for x in lines] == sorted(expect),
            "log_ids_match": [x["request_ids"] for x in lines] == [expect[s]["request_ids"] for s in sorted(expect)],
            "closed_ids_match": all(
                m.get("request_ids") == expected_ids[m["mb"]] for c in calls for m in c["per_micro_batch"]
            ),
        }
        result["checks"] = checks
        result["checks_ok"] = all(checks.values())
        result["dump_complete"] = final  # False: written after a call, more calls were to come
        if final:
            print("dump checks:", json.dumps(checks))

    for phase in args.dump_phases.split(","):
        if phase == "default":  # DUMP_PHASE unset: the hook's default, log_prob
            os.environ.pop("DUMP_PHASE", None)
        else:
            os.environ["DUMP_PHASE"] = phase
        effective = "log_prob" if phase == "default" else phase
        for kind in ("train", "log_prob"):
            t, _ = stepper.train() if kind == "train" else stepper.log_prob()
            events = recorder.take()
            dumps = effective == "all" or effective == ("update_actor" if kind == "train" else "log_prob")
            opened = list(range(next_step, next_step + n_mb)) if dumps else []
            next_step += len(opened)
            for s, ids in zip(opened, expected_ids):
                expect[s] = {"kind": kind, "request_ids": ids, "phase": phase}
            per_mb = analyse_call(events, kind, expected_ids) if dumps else []
            active_finishes = sum(1 for e in events if e["event"] == "finish_dump_step" and e["active"])
            calls.append(
                {
                    "phase": phase,
                    "kind": kind,
                    "seconds": round(t, 4),
                    "expected_steps": opened,
                    "forward_steps": sum(e["event"] == "forward_step_called" for e in events),
                    "active_finishes": active_finishes,
                    "per_micro_batch": per_mb,
                    "events": events,
                }
            )
            print(f"DUMP_PHASE={phase} {kind}: {t * 1e3:.1f} ms, expected steps {opened}, closed {active_finishes}")
            check(final=False)  # what is on disk so far, in case this process is stopped
            CHECKPOINT()
    check(final=True)


def run(args, result):
    import torch

    use_cuda = torch.cuda.is_available()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    prepare_environment(use_cuda)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(bool(args.deterministic), warn_only=True)  # same losses run to run
    import torch.distributed as dist
    import transformers
    import verl

    result["versions"] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "verl": importlib.metadata.version("verl"),
        "verl_file": verl.__file__,
    }
    for dist_name in ("megatron-core", "mbridge", "mindstudio-probe", "tensordict"):
        try:
            result["versions"][dist_name] = importlib.metadata.version(dist_name)
        except importlib.metadata.PackageNotFoundError:
            result["versions"][dist_name] = None
    result["device"] = torch.cuda.get_device_name(0) if use_cuda else "cpu"
    result["env"] = {k: os.environ.get(k) for k in SWITCHES}
    from verl.workers.engine.megatron import transformer_impl

    src = Path(transformer_impl.__file__).read_text()
    result["megatron_impl"] = {"file": transformer_impl.__file__, "patched": "_dump_should_record" in src}
    result["model"] = ensure_model(args)
    force_local_spec_if_no_te(result)
    if use_cuda:
        torch.cuda.set_device(0)
        dist.init_process_group(backend="nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    else:
        dist.init_process_group(backend="gloo", rank=0, world_size=1)
    sync = torch.cuda.synchronize if use_cuda else (lambda: None)
    try:
        t0 = time.perf_counter()
        engine = build_engine(args)
        engine.initialize()
        adapt_padding_mask_for_local_spec(engine, result)
        from megatron.core import parallel_state as mpu
        from megatron.core.utils import unwrap_model

        result["engine"] = {
            "class": f"{type(engine).__module__}.{type(engine).__qualname__}",
            "module_chunks": len(engine.module),
            "module_class": type(engine.module[0]).__name__,
            "unwrapped_class": type(unwrap_model(engine.module[0])).__name__,
            "params": sum(p.numel() for p in engine.module[0].parameters()),
            "pp_world_size": mpu.get_pipeline_model_parallel_world_size(),
            "tp_world_size": mpu.get_tensor_model_parallel_world_size(),
            "init_s": round(time.perf_counter() - t0, 2),
        }
        from megatron.core.pipeline_parallel import get_forward_backward_func

        result["engine"]["schedule"] = get_forward_backward_func().__name__
        recorder = Recorder()
        result["engine"]["observers"] = install_observers(engine, recorder)
        samples = make_samples(args)
        ids = [s["request_id"] for s in samples]
        expected_ids = [ids[i : i + args.micro_batch_size] for i in range(0, len(ids), args.micro_batch_size)]
        result["tokens_per_batch"] = sum(len(s["input_ids"]) for s in samples)
        stepper = Stepper(engine, batch_factory(samples, args), sync)
        if args.mode == "steps":
            run_steps(args, result, engine, stepper, recorder)
            CHECKPOINT()
            if args.then_dump:  # the same engine, now with DUMP_ON=1 (the hook reads it lazily)
                os.environ["DUMP_ON"] = "1"
                args.dump_phases = args.then_dump
                install_wrappers(engine, recorder)
                recorder.take()
                run_dump(args, result, engine, stepper, recorder, expected_ids)
        else:
            run_dump(args, result, engine, stepper, recorder, expected_ids)
        if use_cuda:
            result["max_memory_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    finally:
        dist.destroy_process_group()


def main(argv=None):
    args = parse_args(argv)
    result = {"ok": False, "mode": args.mode, "args": {k: str(v) for k, v in vars(args).items()}}
    global CHECKPOINT
    CHECKPOINT = lambda: save(args.out, result)  # noqa: E731
    t0 = time.perf_counter()
    code = 0
    try:
        run(args, result)
        result["ok"] = True
    except BaseException as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()
        traceback.print_exc()
        code = 1
    result["wall_s"] = round(time.perf_counter() - t0, 2)
    save(args.out, result)
    return code


def save(out, result):
    """Write the result now (also after each phase: a run killed by its timeout keeps what it did)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str) + "\n")
    os.replace(tmp, out)


if __name__ == "__main__":
    sys.exit(main())
