"""Drive verl's real FSDP engine (``FSDPEngineWithLMHead``) on the CPU, in one gloo process.

Run it with the python of a venv from ``venvs.ensure_runtime_venv`` (not pytest's)::

    <venv>/bin/python tests/runtime/fsdp_driver.py --model-dir /tmp/m --out result.json

or, for several runs with torch and transformers imported once, ``--runs SPEC`` (tests/runtime/forked_runs.py).

For each training step it runs, under ``engine.train_mode()``, one
``forward_backward_batch(batch, loss_function=sft_loss, forward_only=False)`` and an
optimizer step, then, under ``engine.eval_mode()``, one forward-only
``forward_backward_batch`` (what compute_log_prob does). The batch holds
``--micro-batches`` micro-batches of ``--micro-batch-size`` samples; every sample
carries a ``request_id`` ("req-0", "req-1", ...) as non-tensor data, and the driver
checks that each micro-batch the engine runs carries exactly its own ids.

The model is a tiny Qwen2 with random weights (hidden 64, 2 layers, vocab 256), made
from a config with a fixed seed and saved to ``--model-dir`` if that has none.

The driver never sets msprobe's switches (DUMP_ON, DUMP_PHASE, MSPROBE_ACTOR_CONFIG):
a test sets them in the environment when it wants a patched engine to dump. It
writes a JSON result (see ``main``) and exits 0, or writes ``{"ok": false, ...}`` with
the traceback and exits 1.

Works with verl 0.9.x (engine from ``EngineRegistry`` with the CPU platform of
``src/rlprobe_patch/demo/drivers/cpu_platform.py``, loaded through ``VERL_USE_EXTERNAL_MODULES``) and 0.7.x/0.8.x
(engine class built directly, as their registry has no CPU entry).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import random
import resource
import socket
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
# cpu_platform.py ships with rlprobe-patch (the consistency demo runs verl's engine on the CPU too).
CPU_PLATFORM_DIR = HERE.parents[1] / "src" / "rlprobe_patch" / "demo" / "drivers"
SEED = 1234
VOCAB_SIZE = 256
PROMPT_LEN = 4
MSPROBE_SWITCHES = ("DUMP_ON", "DUMP_PHASE", "MSPROBE_ACTOR_CONFIG", "PROMPTS_ONLY")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True, type=Path, help="tiny Qwen2 checkpoint; built here if absent")
    parser.add_argument("--strategy", choices=["fsdp2", "fsdp"], default="fsdp2")
    parser.add_argument("--micro-batches", type=int, default=2, help="micro-batches per forward_backward_batch")
    parser.add_argument("--micro-batch-size", type=int, default=2, help="samples per micro-batch")
    parser.add_argument("--steps", type=int, default=1, help="training steps (each followed by a forward-only pass)")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--remove-padding", action="store_true", help="use_remove_padding=True (packed sequences)")
    parser.add_argument("--out", required=True, type=Path, help="result JSON")
    parser.add_argument(
        "--switch-cases",
        type=Path,
        help="JSON {name: env}: for each, with env set, one training forward_backward_batch; "
        "the error it raises and the micro-batches its loss saw are recorded (no optimizer step)",
    )
    parser.add_argument(
        "--v1-batch",
        action="store_true",
        help="after the steps, one training and one forward-only call on a V1-shaped batch: request ids "
        "only in each sample's extra_fields, and a padding sample (see make_v1_batch)",
    )
    args = parser.parse_args(argv)
    if args.micro_batches < 1 or args.micro_batch_size < 1 or args.steps < 0:
        parser.error("--micro-batches and --micro-batch-size must be >= 1, --steps >= 0")
    return args


def verl_version() -> str:
    return importlib.metadata.version("verl")


def verl_has_platform_layer(version: str) -> bool:
    from packaging.version import Version

    return Version(version) >= Version("0.9")


def prepare_environment(version: str) -> None:
    """Environment verl reads at import time; must run before ``import verl``."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(sock.getsockname()[1])
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if verl_has_platform_layer(version):
        # verl 0.9 falls back to the "nvidia" platform without accelerators; our CPU platform
        # replaces it during `import verl`. VERL_ENGINE_DEVICE only picks the engine class
        # out of the registry (which lists cuda/npu), the device stays the CPU.
        sys.path.insert(0, str(CPU_PLATFORM_DIR))
        modules = [m for m in os.environ.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m]
        if "cpu_platform" not in modules:
            modules.insert(0, "cpu_platform")
        os.environ["VERL_USE_EXTERNAL_MODULES"] = ",".join(modules)
        os.environ["VERL_ENGINE_DEVICE"] = "cuda"


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def ensure_tiny_model(model_dir: Path, seed: int) -> None:
    """Save a random-weight Qwen2 (107K params) to ``model_dir`` unless one is there already.

    It is built in a sibling folder and renamed into place, so concurrent drivers never
    see half a checkpoint.
    """
    if (model_dir / "config.json").is_file():
        return
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        architectures=["Qwen2ForCausalLM"],
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = model_dir.parent / f".{model_dir.name}.building-{os.getpid()}"
    model.save_pretrained(staging)
    try:
        os.rename(staging, model_dir)
    except OSError:  # someone else finished first
        import shutil

        shutil.rmtree(staging, ignore_errors=True)
        if not (model_dir / "config.json").is_file():
            raise


def files_sha256(model_dir: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(model_dir.glob("*.safetensors")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def build_engine(version: str, args: argparse.Namespace):
    from verl.trainer.config.config import CheckpointConfig
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig

    model_config = HFModelConfig(
        path=str(args.model_dir),
        load_tokenizer=False,
        use_remove_padding=args.remove_padding,
        override_config={"attn_implementation": "eager"},  # verl asks for flash_attention_2 otherwise
        enable_gradient_checkpointing=False,
    )
    engine_config = FSDPEngineConfig(
        strategy=args.strategy,
        forward_only=False,
        use_dynamic_bsz=False,
        micro_batch_size_per_gpu=args.micro_batch_size,
        use_torch_compile=False,
        seed=args.seed,
    )
    optimizer_config = FSDPOptimizerConfig(lr=1e-4, total_training_steps=max(args.steps, 1) + 1)
    kwargs = dict(
        model_config=model_config,
        engine_config=engine_config,
        optimizer_config=optimizer_config,
        checkpoint_config=CheckpointConfig(),
    )
    if args.strategy == "fsdp":
        # verl hard-codes FSDP(sync_module_states=True), which torch refuses for CPU
        # parameters; with world_size=1 the broadcast it guards does nothing anyway.
        import torch.distributed.fsdp._init_utils as fsdp_init_utils

        fsdp_init_utils._check_module_states_for_sync_module_states = lambda *a, **k: None
    if verl_has_platform_layer(version):
        from verl.workers.engine import EngineRegistry

        return EngineRegistry.new(model_type="language_model", backend=args.strategy, **kwargs), "registry"
    # 0.7.x/0.8.x: EngineRegistry.new asserts "Unknown device: cpu"; build the class it would return on GPU
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    return FSDPEngineWithLMHead(**kwargs), "direct"


def make_samples(args: argparse.Namespace) -> list[dict]:
    """Fixed, seeded samples: token ids, and which tokens the loss counts (the 'response')."""
    import torch

    generator = torch.Generator().manual_seed(args.seed)
    total = args.micro_batches * args.micro_batch_size
    samples = []
    for index in range(total):
        length = int(torch.randint(PROMPT_LEN + 4, PROMPT_LEN + 13, (1,), generator=generator))
        input_ids = torch.randint(0, VOCAB_SIZE, (length,), generator=generator)
        loss_mask = torch.ones(length, dtype=torch.long)
        loss_mask[:PROMPT_LEN] = 0
        samples.append({"request_id": f"req-{index}", "input_ids": input_ids, "loss_mask": loss_mask})
    return samples


def make_batch(samples: list[dict], args: argparse.Namespace):
    """A TensorDict in verl's no-padding layout: jagged nested tensors plus non-tensor metadata.

    ``request_id`` goes in as a list, which verl's ``get_tensordict`` turns into a
    NonTensorStack; TensorDict.chunk (used by prepare_micro_batches) splits that per
    micro-batch. A fresh TensorDict per call, since forward_backward_batch writes into it.
    """
    import torch
    from verl.utils import tensordict_utils as tu

    def jagged(key: str):
        return torch.nested.as_nested_tensor([s[key] for s in samples], layout=torch.jagged)

    position_ids = torch.nested.as_nested_tensor(
        [torch.arange(len(s["input_ids"])) for s in samples], layout=torch.jagged
    )
    return tu.get_tensordict(
        tensor_dict={
            "input_ids": jagged("input_ids"),
            "position_ids": position_ids,
            "loss_mask": jagged("loss_mask"),
            "request_id": [s["request_id"] for s in samples],
        },
        non_tensor_dict={
            "use_remove_padding": args.remove_padding,
            "use_dynamic_bsz": False,
            "micro_batch_size_per_gpu": args.micro_batch_size,
            "temperature": 1.0,
            "global_batch_size": len(samples),
            "use_fused_kernels": False,
        },
    )


def v1_samples(samples: list[dict]) -> list[dict]:
    """The samples as verl 0.9's V1 trainer hands them to the engine (``micro_batch["extra_fields"]``).

    Each sample keeps its fields as a per-sample dict ``extra_fields`` (where verl.request-id puts
    ``request_id``) and a ``uid``; no top-level ``request_id``. Sample 1 is made a padding sample
    the way ``upsample_batch_to_divisible_size`` (verl/trainer/ppo/padding_utils.py, called by
    ``_balance_batch``) makes one: uid ``pad<hex>`` and a deep copy of the first sample's fields,
    so it carries sample 0's request id. Stand-ins: the ids and the other extra_fields are made up
    here, and the batch is built directly instead of fetched from TransferQueue, and the padding
    sample keeps its own tokens instead of verl's minimal padding template.
    """
    import copy

    out = []
    for index, sample in enumerate(samples):
        fields = {"request_id": f"v1-{index}", "num_turns": 1, "reward_extra_info": {"acc": 1.0}}
        out.append({**sample, "uid": f"uid-{index}", "extra_fields": fields})
    if len(out) > 1:
        out[1]["uid"] = "pad0123456789abcdef0123456789abcdef"
        out[1]["extra_fields"] = copy.deepcopy(out[0]["extra_fields"])
    return out


def make_v1_batch(samples: list[dict], args: argparse.Namespace):
    """``make_batch`` with the V1 fields (``v1_samples``) in place of the top-level ``request_id``."""
    batch = make_batch(samples, args)
    del batch["request_id"]
    from verl.utils import tensordict_utils as tu

    extra = tu.get_tensordict(
        tensor_dict={"uid": [s["uid"] for s in samples], "extra_fields": [s["extra_fields"] for s in samples]}
    )
    batch["uid"] = extra["uid"]
    batch["extra_fields"] = extra["extra_fields"]
    return batch


def expected_v1_log_ids(samples: list[dict], args: argparse.Namespace) -> list[list[str]]:
    """Per micro-batch, the request ids of its real samples (padding left out)."""
    size = args.micro_batch_size
    chunks = [samples[i : i + size] for i in range(0, len(samples), size)]
    return [[s["extra_fields"]["request_id"] for s in chunk if not s["uid"].startswith("pad")] for chunk in chunks]


class MicroBatchSpy:
    """Wraps ``engine.forward_step`` (on the instance) to record the request ids each micro-batch carries."""

    def __init__(self, engine):
        from verl.utils import tensordict_utils as tu

        self._get = tu.get
        self._forward_step = engine.forward_step
        self.calls: list[list[str] | None] = []
        engine.forward_step = self

    def __call__(self, micro_batch, *args, **kwargs):
        ids = self._get(micro_batch, "request_id", default=None)
        self.calls.append(None if ids is None else [str(i) for i in ids])
        return self._forward_step(micro_batch, *args, **kwargs)

    def take(self) -> list[list[str] | None]:
        calls, self.calls = self.calls, []
        return calls


def expected_micro_batch_ids(samples: list[dict], args: argparse.Namespace) -> list[list[str]]:
    ids = [s["request_id"] for s in samples]
    size = args.micro_batch_size
    return [ids[i : i + size] for i in range(0, len(ids), size)]


def log_probs_summary(output) -> dict:
    import torch

    log_probs = output["model_output"]["log_probs"]
    values = (log_probs.values() if log_probs.is_nested else log_probs).detach().to(torch.float32).contiguous()
    lengths = [int(t.numel()) for t in log_probs.unbind()] if log_probs.is_nested else list(log_probs.shape)
    return {
        "sha256": hashlib.sha256(values.numpy().tobytes()).hexdigest(),
        "sum": float(values.sum()),
        "numel": int(values.numel()),
        "lengths": lengths,
    }


def timed(timings: list[dict], name: str, step: int | None, fn):
    started = time.perf_counter()
    result = fn()
    timings.append({"call": name, "step": step, "seconds": round(time.perf_counter() - started, 4)})
    return result


def run(args: argparse.Namespace, result: dict) -> None:
    wall_start = time.perf_counter()
    version = verl_version()
    result["verl_version"] = version
    prepare_environment(version)
    seed_everything(args.seed)

    import torch
    import torch.distributed as dist
    import transformers

    result["torch_version"] = torch.__version__
    result["transformers_version"] = transformers.__version__
    result["msprobe_env"] = {name: os.environ.get(name) for name in MSPROBE_SWITCHES}

    ensure_tiny_model(args.model_dir, args.seed)
    result["model_sha256"] = files_sha256(args.model_dir)

    timings: list[dict] = []
    result["timings"] = timings
    timed(timings, "import_verl", None, lambda: __import__("verl"))
    from verl.utils.device import get_device_name
    from verl.workers.utils.losses import sft_loss

    result["verl_device_name"] = get_device_name()
    if result["verl_device_name"] != "cpu":
        raise RuntimeError(f"verl picked device {result['verl_device_name']!r}, not the CPU")

    dist.init_process_group(backend="gloo", rank=0, world_size=1)
    try:
        engine, construction = timed(timings, "build_engine", None, lambda: build_engine(version, args))
        result["engine"] = {
            "class": f"{type(engine).__module__}.{type(engine).__qualname__}",
            "construction": construction,
        }
        timed(timings, "initialize", None, engine.initialize)
        result["engine"]["module_class"] = type(engine.module).__name__
        from verl.workers.engine.fsdp.transformer_impl import device_name as engine_device_name

        result["engine"]["transformer_impl_device_name"] = engine_device_name

        spy = MicroBatchSpy(engine)
        samples = make_samples(args)
        expected_ids = expected_micro_batch_ids(samples, args)
        result["request_ids"] = [s["request_id"] for s in samples]

        def loss_fn(model_output, data, dp_group=None):
            return sft_loss(config=None, model_output=model_output, data=data, dp_group=dp_group)

        if args.switch_cases:
            result["switch_cases"] = run_switch_cases(engine, samples, args, loss_fn)
            return

        steps = []
        result["steps"] = steps
        for step in range(args.steps):
            record: dict = {"step": step}
            steps.append(record)
            with engine.train_mode():
                engine.optimizer_zero_grad()
                batch = make_batch(samples, args)
                output = timed(
                    timings,
                    "forward_backward_batch(train)",
                    step,
                    lambda batch=batch: engine.forward_backward_batch(batch, loss_function=loss_fn, forward_only=False),
                )
                record["train_micro_batch_request_ids"] = spy.take()
                record["losses"] = [float(loss) for loss in output["loss"]]
                grad_norm = timed(timings, "optimizer_step", step, engine.optimizer_step)
                record["grad_norm"] = float(grad_norm)
                record["lr"] = float(timed(timings, "lr_scheduler_step", step, engine.lr_scheduler_step))
            with engine.eval_mode():
                batch = make_batch(samples, args)
                output = timed(
                    timings,
                    "forward_backward_batch(forward_only)",
                    step,
                    lambda batch=batch: engine.forward_backward_batch(batch, loss_function=None, forward_only=True),
                )
                record["forward_only_micro_batch_request_ids"] = spy.take()
                record["log_probs"] = log_probs_summary(output)
            for phase in ("train", "forward_only"):
                seen = record[f"{phase}_micro_batch_request_ids"]
                if seen != expected_ids:
                    raise AssertionError(f"step {step} {phase}: micro-batches carried {seen}, expected {expected_ids}")
        if args.v1_batch:
            v1 = v1_samples(samples)
            result["v1_expected_log_ids"] = expected_v1_log_ids(v1, args)
            v1_calls = {}
            with engine.train_mode():
                engine.optimizer_zero_grad()
                batch = make_v1_batch(v1, args)
                engine.forward_backward_batch(batch, loss_function=loss_fn, forward_only=False)
                v1_calls["train"] = len(spy.take())
            with engine.eval_mode():
                batch = make_v1_batch(v1, args)
                engine.forward_backward_batch(batch, loss_function=None, forward_only=True)
                v1_calls["forward_only"] = len(spy.take())
            result["v1_micro_batches"] = v1_calls
        result["msprobe_imported"] = any(name.split(".")[0] == "msprobe" for name in sys.modules)
        result["grad_norms"] = [s["grad_norm"] for s in steps]
        result["losses"] = [s["losses"] for s in steps]
        result["log_probs_sha256"] = [s["log_probs"]["sha256"] for s in steps]
    finally:
        dist.destroy_process_group()
    result["wall_seconds"] = round(time.perf_counter() - wall_start, 3)


def run_switch_cases(engine, samples: list[dict], args: argparse.Namespace, loss_fn) -> dict:
    """Each case's env, then one training call: what it raised, and how many micro-batches reached
    the loss (0: no step ran). The switches are read once per process, so their cache
    (`sys.modules["_rlprobe_patch_run"]`) is dropped before each case."""
    cases = json.loads(args.switch_cases.read_text())
    outcomes = {}
    for name, env in cases.items():
        for key in MSPROBE_SWITCHES:
            os.environ.pop(key, None)
        os.environ.update(env)
        sys.modules.pop("_rlprobe_patch_run", None)
        engine._debugger = None
        calls = []

        def counting_loss(*a, calls=calls, **k):
            calls.append(1)
            return loss_fn(*a, **k)

        error = None
        with engine.train_mode():
            engine.optimizer_zero_grad()
            try:
                batch = make_batch(samples, args)
                engine.forward_backward_batch(batch, loss_function=counting_loss, forward_only=False)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
        outcomes[name] = {
            "error": error,
            "loss_calls": len(calls),
            "debugger": getattr(engine, "_debugger", None) is not None,
        }
    return outcomes


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result: dict = {
        "ok": False,
        "pid": os.getpid(),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    }
    code = 0
    try:
        run(args, result)
        result["ok"] = True
    except BaseException as exc:  # the JSON says what broke; the exit code says that it did
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()
        traceback.print_exc()
        code = 1
    result["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, args.out)
    return code


def preload() -> None:
    """What every run imports before verl: torch and transformers (`--runs`: once for all the runs)."""
    import numpy  # noqa: F401
    import torch
    import torch.distributed  # noqa: F401
    import transformers  # noqa: F401
    from transformers import AutoModelForCausalLM, Qwen2Config  # noqa: F401


if __name__ == "__main__":
    if sys.argv[1:2] == ["--runs"]:  # several runs, the imports once (tests/runtime/forked_runs.py)
        from forked_runs import run_forked

        sys.exit(run_forked(Path(sys.argv[2]), preload, main))
    sys.exit(main())
