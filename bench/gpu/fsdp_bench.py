"""verl's real FSDP engine on the GPU: loss identity, step-time cost with dumping off, dumps with it on.

Run with the python whose `import verl` is the tree under test (bench/gpu/run_gpu.sh sets
PYTHONPATH); it never sets the msprobe switches itself except where a mode says so::

    python bench/gpu/fsdp_bench.py --mode steps   --out r.json [--pristine-file F --interleave 40]
    python bench/gpu/fsdp_bench.py --mode dump    --out r.json --dump-phases log_prob
    python bench/gpu/fsdp_bench.py --mode dump    --out r.json --dump-phases update_actor,all

What runs: `FSDPEngineWithLMHead` from verl's `EngineRegistry` (FSDP2, one process, NCCL on
CUDA; gloo and src/rlprobe_patch/demo/drivers/cpu_platform.py on a machine without a GPU, for a dry run),
on a random-weight Qwen2 built from a config (`--hidden`, `--layers`, ...), with verl's
`sft_loss`, `optimizer_step` and `lr_scheduler_step`, as verl's workers call them. Each
step is: `train_mode()`: zero_grad, `forward_backward_batch(forward_only=False)`, optimizer
and lr step; then `eval_mode()`: `forward_backward_batch(forward_only=True)` (what
compute_log_prob does). Every sample carries a `request_id`; a spy on `forward_step`
checks that each micro-batch carries its own ids (switched off while timing).

Modes:

* `steps`: `--steps` steps, recording losses, grad norms, a sha256 of the log-probs and
  the wall time of each (CUDA-synchronised). With `--pristine-file` (the unpatched
  `transformer_impl.py` of the same release) and `--interleave K`, it then also loads that
  file as a separate module and runs K ABBA rounds in this one process, switching
  `forward_backward_batch` on the engine instance between the pristine function and the
  patched one (everything else shared: model, optimizer, data, CUDA state), so the two
  are compared step by step rather than across processes.
* `dump`: DUMP_ON must be set by the caller. For each phase in `--dump-phases` it sets
  DUMP_PHASE (the hook reads it on every call) and runs one step (one training call, one
  forward-only call), recording which msprobe steps each call opened; then it reads the
  dump (`step<N>/rank0/dump.json`) and `update_actor_log.jsonl` and checks them.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import random
import socket
import statistics
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tests" / "runtime"))
# cpu_platform (a dry run's CPU platform for verl) lives with the demo's drivers
sys.path.insert(0, str(REPO / "src" / "rlprobe_patch" / "demo" / "drivers"))

CHECKPOINT = lambda: None  # noqa: E731  (main() points it at save())
SWITCHES = ("DUMP_ON", "DUMP_PHASE", "MSPROBE_ACTOR_CONFIG")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=["steps", "dump"], required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--model-dir", type=Path, default=Path("/tmp/rlprobe-bench/qwen2"))
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
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=3, help="steps left out of the medians")
    p.add_argument("--pristine-file", type=Path)
    p.add_argument("--interleave", type=int, default=0, help="ABBA rounds of pristine vs patched (steps mode)")
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
    p.add_argument("--attn", default=None, help="attn_implementation (default: sdpa on CUDA, eager on CPU)")
    p.add_argument("--seed", type=int, default=1234)
    return p.parse_args(argv)


# --------------------------------------------------------------------------- setup


def prepare_environment(use_cuda: bool) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(sock.getsockname()[1])
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("TOKENIZERS_PARALLELISM", "false")):
        os.environ.setdefault(k, v)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
    if not use_cuda:  # dry run on a machine without a GPU: the CPU platform of the runtime tests
        modules = [m for m in os.environ.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m]
        if "cpu_platform" not in modules:
            modules.insert(0, "cpu_platform")
        os.environ["VERL_USE_EXTERNAL_MODULES"] = ",".join(modules)
        os.environ["VERL_ENGINE_DEVICE"] = "cuda"


def ensure_model(args) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

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
    )
    if not (args.model_dir / "config.json").is_file():
        torch.manual_seed(args.seed)
        model = AutoModelForCausalLM.from_config(Qwen2Config(**cfg))
        staging = args.model_dir.parent / f".{args.model_dir.name}.{os.getpid()}"
        model.save_pretrained(staging)
        args.model_dir.parent.mkdir(parents=True, exist_ok=True)
        os.rename(staging, args.model_dir)
    digest = hashlib.sha256()
    for path in sorted(args.model_dir.glob("*.safetensors")):
        digest.update(path.read_bytes())
    n_params = None
    return {"config": cfg, "sha256": digest.hexdigest(), "params": n_params}


def build_engine(args, attn: str):
    from verl.trainer.config.config import CheckpointConfig
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
    from verl.workers.engine import EngineRegistry

    model_config = HFModelConfig(
        path=str(args.model_dir),
        load_tokenizer=False,
        use_remove_padding=False,  # True needs flash-attn's varlen kernels, not in the image
        override_config={"attn_implementation": attn},
        enable_gradient_checkpointing=False,
    )
    engine_config = FSDPEngineConfig(
        strategy="fsdp2",
        forward_only=False,
        use_dynamic_bsz=False,
        micro_batch_size_per_gpu=args.micro_batch_size,
        use_torch_compile=False,
        seed=args.seed,
    )
    optimizer_config = FSDPOptimizerConfig(lr=1e-5, total_training_steps=10_000)
    return EngineRegistry.new(
        model_type="language_model",
        backend="fsdp2",
        model_config=model_config,
        engine_config=engine_config,
        optimizer_config=optimizer_config,
        checkpoint_config=CheckpointConfig(),
    )


def make_samples(args) -> list[dict]:
    import torch

    g = torch.Generator().manual_seed(args.seed)
    samples = []
    for i in range(args.micro_batches * args.micro_batch_size):
        length = int(torch.randint(args.seq_min, args.seq_max + 1, (1,), generator=g))
        ids = torch.randint(0, args.vocab, (length,), generator=g)
        mask = torch.ones(length, dtype=torch.long)
        mask[: args.prompt_len] = 0
        samples.append({"request_id": f"req-{i}", "input_ids": ids, "loss_mask": mask})
    return samples


def batch_factory(samples, args):
    from fsdp_driver import make_batch  # tests/runtime: verl's no-padding TensorDict layout

    ns = argparse.Namespace(remove_padding=False, micro_batch_size=args.micro_batch_size)
    return lambda: make_batch(samples, ns)


def log_probs_digest(output) -> dict:
    import torch

    lp = output["model_output"]["log_probs"]
    values = (lp.values() if lp.is_nested else lp).detach().to(torch.float32).contiguous().cpu()
    return {"sha256": hashlib.sha256(values.numpy().tobytes()).hexdigest(), "sum": float(values.sum())}


class Spy:
    """Wraps engine.forward_step on the instance: which request ids each micro-batch carried."""

    def __init__(self, engine):
        from verl.utils import tensordict_utils as tu

        self.engine, self.get, self.calls = engine, tu.get, []
        self.orig = engine.forward_step
        engine.forward_step = self

    def __call__(self, micro_batch, *a, **k):
        ids = self.get(micro_batch, "request_id", default=None)
        self.calls.append(None if ids is None else [str(i) for i in ids])
        return self.orig(micro_batch, *a, **k)

    def take(self):
        calls, self.calls = self.calls, []
        return calls

    def remove(self):
        del self.engine.forward_step  # back to the class's method


# --------------------------------------------------------------------------- one step


class Stepper:
    def __init__(self, engine, new_batch, sync):
        from verl.workers.utils.losses import sft_loss

        self.engine, self.new_batch, self.sync = engine, new_batch, sync
        self.loss_fn = lambda model_output, data, dp_group=None: sft_loss(
            config=None, model_output=model_output, data=data, dp_group=dp_group
        )

    def train(self):
        e = self.engine
        self.sync()
        t0, c0 = time.perf_counter(), time.process_time()
        with e.train_mode():
            e.optimizer_zero_grad()
            out = e.forward_backward_batch(self.new_batch(), loss_function=self.loss_fn, forward_only=False)
            grad_norm = e.optimizer_step()
            e.lr_scheduler_step()
        self.sync()
        self.last_cpu_s = time.process_time() - c0  # CPU time of this process (all threads)
        return time.perf_counter() - t0, out, grad_norm

    def log_prob(self):
        e = self.engine
        self.sync()
        t0, c0 = time.perf_counter(), time.process_time()
        with e.eval_mode():
            out = e.forward_backward_batch(self.new_batch(), loss_function=None, forward_only=True)
        self.sync()
        self.last_cpu_s = time.process_time() - c0  # CPU time of this process (all threads)
        return time.perf_counter() - t0, out


def load_pristine_fbb(pristine_file: Path):
    """`FSDPEngine.forward_backward_batch` of the unpatched file, compiled as its own module."""
    from verl.workers.engine.base import EngineRegistry

    # named inside verl's package, so that its relative imports (`from ..base import ...`) resolve
    name = "verl.workers.engine.fsdp._rlprobe_bench_pristine_impl"
    spec = importlib.util.spec_from_file_location(name, pristine_file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    # its classes must not register themselves (the registry refuses a second cuda entry)
    descriptor = EngineRegistry.__dict__["register"]
    EngineRegistry.register = classmethod(lambda cls, *a, **k: lambda engine_class: engine_class)
    try:
        spec.loader.exec_module(module)
    finally:
        EngineRegistry.register = descriptor
    fn = module.FSDPEngine.forward_backward_batch
    src = Path(pristine_file).read_text()
    if "rlprobe-patch" in src or "_should_dump" in src:
        raise RuntimeError(f"{pristine_file} is not pristine: it holds rlprobe-patch code")
    return fn


def median(xs):
    return statistics.median(xs) if xs else None


# --------------------------------------------------------------------------- modes


def run_steps(args, result, engine, stepper, spy, expected_ids):
    import torch

    steps = []
    result["steps"] = steps
    for i in range(args.steps):
        t_train, out, grad_norm = stepper.train()
        c_train = stepper.last_cpu_s
        train_ids = spy.take()
        t_lp, lp_out = stepper.log_prob()
        lp_ids = spy.take()
        if train_ids != expected_ids or lp_ids != expected_ids:
            raise AssertionError(f"step {i}: micro-batches carried {train_ids} / {lp_ids}, expected {expected_ids}")
        steps.append(
            {
                "step": i,
                "losses": [float(x) for x in out["loss"]],
                "grad_norm": float(grad_norm),
                "log_probs": log_probs_digest(lp_out),
                "train_s": round(t_train, 6),
                "log_prob_s": round(t_lp, 6),
                "train_cpu_s": round(c_train, 4),
                "log_prob_cpu_s": round(stepper.last_cpu_s, 4),
            }
        )
        print(
            f"step {i}: train {t_train * 1e3:.1f} ms (cpu {c_train:.2f} s), log_prob {t_lp * 1e3:.1f} ms, "
            f"loss {steps[-1]['losses']}"
        )
    timed = steps[args.warmup :]
    result["median_train_s"] = median([s["train_s"] for s in timed])
    result["median_log_prob_s"] = median([s["log_prob_s"] for s in timed])

    CHECKPOINT()
    if args.pristine_file and args.interleave:
        spy.remove()  # nothing of ours between the engine and its forward_step while timing
        patched = type(engine).forward_backward_batch
        pristine = load_pristine_fbb(args.pristine_file)
        if patched is pristine or patched.__code__.co_code == pristine.__code__.co_code:
            raise RuntimeError("the engine's forward_backward_batch is the pristine one: is the tree patched?")
        variants = {"pristine": pristine, "patched": patched}
        times = {v: {"train": [], "log_prob": []} for v in variants}
        order = []
        if args.interleave_nondeterministic:
            torch.use_deterministic_algorithms(False)
        started = time.perf_counter()
        rounds = 0
        for r in range(args.interleave):
            if args.interleave_budget and r % 2 == 0 and time.perf_counter() - started > args.interleave_budget:
                break  # whole ABBA blocks only
            rounds += 1
            pair = ("pristine", "patched") if r % 2 == 0 else ("patched", "pristine")  # ABBA
            for v in pair:
                engine.forward_backward_batch = variants[v].__get__(engine)
                t_train, _, _ = stepper.train()
                t_lp, _ = stepper.log_prob()
                times[v]["train"].append(t_train)
                times[v]["log_prob"].append(t_lp)
                order.append(v)
        del engine.forward_backward_batch
        inter = {
            "rounds": rounds,
            "pattern": "ABBA",
            "raw_s": times,
            "deterministic": torch.are_deterministic_algorithms_enabled(),
        }
        for kind in ("train", "log_prob"):
            mp, mu = median(times["patched"][kind]), median(times["pristine"][kind])
            inter[f"median_{kind}_s"] = {"patched": mp, "pristine": mu}
            inter[f"ratio_{kind}"] = mp / mu
            # paired: each round's patched time over the pristine time next to it
            pairs = [p / u for p, u in zip(times["patched"][kind], times["pristine"][kind])]
            inter[f"paired_ratio_median_{kind}"] = median(pairs)
        result["interleaved"] = inter
        print(
            f"interleaved {rounds} rounds: train ratio {inter['ratio_train']:.4f} "
            f"(paired {inter['paired_ratio_median_train']:.4f}), log_prob ratio {inter['ratio_log_prob']:.4f} "
            f"(paired {inter['paired_ratio_median_log_prob']:.4f})"
        )


def read_dump(dump_path: Path) -> dict:
    steps = {}
    for step_dir in sorted(dump_path.glob("step*"), key=lambda p: int(p.name[4:])):
        files = sorted(p.name for p in (step_dir / "rank0").glob("*")) if (step_dir / "rank0").is_dir() else []
        data = {}
        if (step_dir / "rank0" / "dump.json").is_file():
            data = json.loads((step_dir / "rank0" / "dump.json").read_text()).get("data", {})
        steps[int(step_dir.name[4:])] = {
            "files": files,
            "data_keys": len(data),
            "backward_keys": sum(".backward" in k for k in data),
            "module_keys": sum(k.startswith("Module.") for k in data),
            "sample_keys": sorted(data)[:4],
        }
    logs = sorted(dump_path.glob("*/update_actor_log.jsonl"))
    lines = [json.loads(line) for p in logs for line in p.read_text().splitlines() if line.strip()]
    return {"steps": steps, "log_paths": [str(p) for p in logs], "log_lines": lines}


def run_dump(args, result, engine, stepper, spy, expected_ids):
    if not os.environ.get("DUMP_ON"):
        raise RuntimeError("--mode dump needs DUMP_ON=1 in the environment")
    config = json.loads(Path(os.environ["MSPROBE_ACTOR_CONFIG"]).read_text())
    dump_path = Path(config["dump_path"])
    calls = []
    result["calls"] = calls
    n_mb = args.micro_batches
    next_step = 0
    expect_steps = {}

    def check(final):
        found = read_dump(dump_path)
        result["dump"] = {"dump_path": str(dump_path), **{k: v for k, v in found.items() if k != "steps"}}
        result["dump"]["steps"] = {str(k): v for k, v in found["steps"].items()}
        steps = found["steps"]
        lines = found["log_lines"]
        checks = {
            "step_dirs_match": sorted(steps) == sorted(expect_steps),
            "dump_json_every_step": all("dump.json" in steps[s]["files"] for s in steps),
            "train_steps_have_backward": all(
                steps.get(s, {}).get("backward_keys", 0) > 0 for s, e in expect_steps.items() if e["kind"] == "train"
            ),
            "log_prob_steps_have_no_backward": all(
                steps.get(s, {}).get("backward_keys", 1) == 0
                for s, e in expect_steps.items()
                if e["kind"] == "log_prob"
            ),
            "modules_recorded": all(steps[s]["module_keys"] > 0 for s in steps),
            "one_log_line_per_step": [line["step"] for line in lines] == sorted(expect_steps),
            "log_ids_match": [line["request_ids"] for line in lines]
            == [expect_steps[s]["request_ids"] for s in sorted(expect_steps)],
            "micro_batch_ids_match": all(c["ids"] == expected_ids for c in calls),
        }
        result["expected_steps"] = {str(k): v for k, v in expect_steps.items()}
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
            if kind == "train":
                t, out, _ = stepper.train()
                losses = [float(x) for x in out["loss"]]
            else:
                t, out = stepper.log_prob()
                losses = None
            ids = spy.take()
            dumps = effective == "all" or effective == ("update_actor" if kind == "train" else "log_prob")
            opened = list(range(next_step, next_step + n_mb)) if dumps else []
            next_step += len(opened)
            for s, mb_ids in zip(opened, ids):
                expect_steps[s] = {"kind": kind, "request_ids": mb_ids, "phase": phase}
            calls.append(
                {
                    "phase": phase,
                    "kind": kind,
                    "seconds": round(t, 4),
                    "expected_steps": opened,
                    "ids": ids,
                    "losses": losses,
                }
            )
            print(f"DUMP_PHASE={phase} {kind}: {t * 1e3:.1f} ms, expected msprobe steps {opened}")
            check(final=False)  # what is on disk so far, in case this process is stopped
            CHECKPOINT()
    check(final=True)


def run(args, result):
    import torch

    use_cuda = torch.cuda.is_available()
    prepare_environment(use_cuda)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(bool(args.deterministic), warn_only=True)
    import torch.distributed as dist
    import transformers
    import verl

    result["versions"] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "verl": importlib.metadata.version("verl"),
        "verl_file": verl.__file__,
        "tensordict": importlib.metadata.version("tensordict"),
    }
    try:
        result["versions"]["msprobe"] = importlib.metadata.version("mindstudio-probe")
    except importlib.metadata.PackageNotFoundError:
        result["versions"]["msprobe"] = None
    result["device"] = torch.cuda.get_device_name(0) if use_cuda else "cpu"
    result["env"] = {k: os.environ.get(k) for k in SWITCHES}
    from verl.workers.engine.fsdp import transformer_impl

    src = Path(transformer_impl.__file__).read_text()
    result["fsdp_impl"] = {
        "file": transformer_impl.__file__,
        "patched": "_should_dump" in src,
        "sha256": hashlib.sha256(src.encode()).hexdigest(),
    }
    result["model"] = ensure_model(args)
    if use_cuda:
        torch.cuda.set_device(0)
        dist.init_process_group(backend="nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    else:
        dist.init_process_group(backend="gloo", rank=0, world_size=1)
    sync = torch.cuda.synchronize if use_cuda else (lambda: None)
    try:
        t0 = time.perf_counter()
        engine = build_engine(args, args.attn or ("sdpa" if use_cuda else "eager"))
        engine.initialize()
        result["engine"] = {
            "class": f"{type(engine).__module__}.{type(engine).__qualname__}",
            "module_class": type(engine.module).__name__,
            "params": sum(p.numel() for p in engine.module.parameters()),
            "init_s": round(time.perf_counter() - t0, 2),
        }
        samples = make_samples(args)
        result["tokens_per_batch"] = sum(len(s["input_ids"]) for s in samples)
        ids = [s["request_id"] for s in samples]
        expected_ids = [ids[i : i + args.micro_batch_size] for i in range(0, len(ids), args.micro_batch_size)]
        spy = Spy(engine)
        stepper = Stepper(engine, batch_factory(samples, args), sync)
        if args.mode == "steps":
            run_steps(args, result, engine, stepper, spy, expected_ids)
            CHECKPOINT()
            if args.then_dump:  # the same engine, now with DUMP_ON=1 (the hook reads it lazily)
                os.environ["DUMP_ON"] = "1"
                args.dump_phases = args.then_dump
                spy = Spy(engine) if "forward_step" not in vars(engine) else spy
                run_dump(args, result, engine, stepper, spy, expected_ids)
        else:
            run_dump(args, result, engine, stepper, spy, expected_ids)
        if use_cuda:
            result["max_memory_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    finally:
        dist.destroy_process_group()


def main(argv=None) -> int:
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
