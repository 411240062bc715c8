"""vllm.model-runner and vllm.dispatch-logger on a real NVIDIA GPU: the proof, and their cost with dumping off.

Runs the released vLLM GPU wheel (0.24.0, the release verl 0.9.1 pins: its Python files, its
`_C_stable_libtorch` CUDA kernels and FlashAttention 3), unpatched and patched (`rlprobe-patch apply
--vllm-root ... --mode consistency`), over random Qwen2 models, with the V1 model runner (vLLM's
default for Qwen2) and the V2 one (`VLLM_USE_V2_MODEL_RUNNER=1`). The engine core runs in each
child's process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so a child can say whether msprobe was imported.
Where it runs it needs plain `python3` with torch (CUDA), transformers and the carried wheels; no
rlprobe-patch import.

Prepare, here in the repo root (`.gpu/` ignored through .git/info/exclude):

    .venv/bin/python bench/vllm_gpu.py pack --wheel .../vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl
    $(python3 bench/vllm_gpu.py wheels)      # pip download of WHEELS (below) into .gpu/whl, 25 MB

`pack` writes .gpu/vllm.tar.xz (the wheel's Python files, dist-info and small extensions, 5 MB;
not the FA2, MoE, FlashMLA and DeepGEMM/FMHA binaries, which this path does not load),
.gpu/c.xz.0 + .gpu/c.xz.1 (`vllm/_C_stable_libtorch.abi3.so`, xz: 85 MB, cut in two),
.gpu/fa3.xz (`vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so`, xz: 8 MB; vLLM 0.24 on CUDA imports
vllm.vllm_flash_attn unconditionally) and .gpu/pfiles (the three files rlprobe-patch writes).
After a change to the patches, `.venv/bin/python bench/vllm_gpu.py pfiles` rewrites .gpu/pfiles alone
(`rlprobe-patch apply` with the repo's current patches over the tree in .gpu/vllm.tar.xz).
That is more than one device call carries (64 MiB), so two calls, back to back (the machine stays
warm 30 s; a call's carried paths are gone in the next call, /tmp stays):

    # call 1: carry .gpu/c.xz.0 .gpu/whl .gpu/vllm.tar.xz
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl
    mkdir -p /tmp/parts && cp .gpu/c.xz.0 /tmp/parts/
    python3 bench/vllm_gpu.py prepare --dest /tmp/gpu --tar .gpu/vllm.tar.xz
    # call 2: carry .gpu/c.xz.1 .gpu/fa3.xz .gpu/pfiles
    cp -r .gpu/c.xz.1 .gpu/fa3.xz .gpu/pfiles /tmp/parts/ && export PYTHONPATH=/tmp/site
    python3 bench/vllm_gpu.py prepare --dest /tmp/gpu --so /tmp/parts/c.xz.0 /tmp/parts/c.xz.1 \
        --fa3 /tmp/parts/fa3.xz --overlay /tmp/parts/pfiles
    python3 bench/vllm_gpu.py all --root /tmp/gpu --out $OUT --bench-runs 15 [--skip-proof | --skip-bench]

`all` checks both trees against the wheel's RECORD (plain: every file it holds is the wheel's, the
extensions included; patched: only the three files rlprobe-patch writes differ), then:
- the proof, per runner, four engines in parallel: unpatched, patched with no dump config ("off"),
  patched with a msprobe statistics config ("on") and one cut to one request ("sliced"); a tiny
  bfloat16 Qwen2 (hidden 128, 2 layers, head_dim 64), 4 prompts with verl-style ids, 4 tokens each,
  greedy, one logprob per token. It asserts what tests/runtime/test_runtime_vllm.py asserts on the
  CPU: off gives the unpatched tokens and logprobs exactly and never imports msprobe; on prints the
  `vllm.model-runner r2` hook line and writes one msprobe step `step{N}/rank0/dump.json` per forward
  pass of the requests sent, numbered from 0, and one dispatch-log line per step (first the prefill
  of all 4, then decode with 1 token each), request ids = the ids sent + `-<8 hex>`, tokens
  scheduled over all passes = prompts + fed-back tokens, embedding rows dumped == tokens scheduled;
  sliced dumps only the wanted request's rows (12 of 46, then 1). The regression test of r1's bug:
  no vLLM start-up pass is dumped or logged. The V2 runner's memory profile (`_dummy_run` ->
  `execute_model(dummy_run=True)`, requests `_dummy_req_*`) and kernel warm-up (`_warmup_<i>_`) go
  through its execute_model; r1 dumped them (found on an H200: 3 extra steps, the requests' passes
  numbered from 3);
- the benchmark, per runner: one engine per tree (bfloat16 Qwen2, hidden 1024, 8 layers, 32 prompts
  of 16 tokens, 128 tokens each, `ignore_eos`, synchronous scheduling, each engine pinned to 4
  cores of its own), kept alive; each run adds the requests to both and alternates their decode
  steps one by one, timing each step; decode tokens/s of a run = decode tokens / the run's step time.
Every engine: enforce_eager, skip_tokenizer_init, vLLM's own attention choice (FlashAttention 3 on
Hopper), a 1 GiB KV cache (`kv_cache_memory_bytes`: several engines share the GPU) and
VLLM_USE_FLASHINFER_SAMPLER=0 (flashinfer is not carried; greedy decoding never uses that sampler).
Writes to --out: summary.json (every result and check), report.md (the checks and the benchmark
tables), logs.txt (key lines and tails of every child's log), dispatch_v1.jsonl, dispatch_v2.jsonl,
dump_v1_step0.json, dump_v2_step0.json, logs_full.tar.gz. Prints report.md; exit status 1 when a
check failed.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import json
import lzma
import os
import queue
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import traceback
import zipfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
PROMPT_LENGTHS = (10, 11, 12, 13)
MAX_TOKENS = 4
RUNNERS = {"v1": "0", "v2": "1"}
SUFFIX = re.compile(r"-[0-9a-f]{8}$")
STARTUP = re.compile(r"_dummy_req_\d+$|_warmup_\d+_$")
HOOK_LINE = "rlprobe-patch: vllm.model-runner r2 hooks active"
PATCHED_FILES = (
    "vllm/v1/worker/dispatch_logger.py",
    "vllm/v1/worker/gpu/model_runner.py",
    "vllm/v1/worker/gpu_model_runner.py",
)
C_SO = "vllm/_C_stable_libtorch.abi3.so"
FA3_SO = "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so"
# Left out of .gpu/vllm.tar.xz: too big to carry, and not on this path (FlashAttention 3 serves Hopper,
# FA2 is for older GPUs, Qwen2 has no MoE layer, DeepGEMM/FMHA are for FP8 and Blackwell).
LEFT_OUT = (
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",
    "vllm/_moe_C_stable_libtorch.abi3.so",
    "vllm/_flashmla_C.abi3.so",
    "vllm/_flashmla_extension_C.abi3.so",
    "vllm/vllm-rs",
    "vllm/third_party/deep_gemm/",
    "vllm/third_party/fmha_sm100/",
)
# What vLLM 0.24 (`from vllm import LLM` and an engine) and msprobe 26.2.0 import that the device's image
# lacks (cp312, manylinux x86_64), as carried in .gpu/whl.
WHEELS = (
    "annotated-types==0.8.0 apache-tvm-ffi==0.1.15.post2 blake3==1.0.11 cachetools==8.0.2 cbor2==6.3.0 "
    "diskcache==5.6.3 et_xmlfile==2.0.0 fastapi==0.136.3 httpcore2==2.16.2 httpx2==2.16.2 ijson==3.6.0 "
    "jiter==0.19.0 lark==1.2.2 llguidance==1.7.6 mindstudio-probe==26.2.0 msgspec==0.23.0 openai==3.57.0 "
    "openai-harmony==0.0.8 openpyxl==3.1.5 partial-json-parser==0.2.1.1.post7 "
    "prometheus-fastapi-instrumentator==8.1.0 pybase64==1.5.1 pydantic==2.14.4 pydantic_core==2.50.5 "
    "python-json-logger==4.2.0 pytz==2026.6 pyzmq==27.3.0 setproctitle==1.3.8 sniffio==1.3.1 "
    "starlette==1.10.0 truststore==0.10.5 typing-inspection==0.4.5 typing_extensions==4.16.0 xgrammar==0.2.9"
)


# --------------------------------------------------------------------------------------------------
# Here: pack the wheel, patch it, cut the big extension in two.


def pack(args: argparse.Namespace) -> None:
    gpu = Path(args.dest)
    gpu.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vllm-gpu-pack-") as tmp:
        root = Path(tmp) / "root"
        with zipfile.ZipFile(args.wheel) as wheel:
            names = [n for n in wheel.namelist() if not n.startswith(LEFT_OUT) and n not in (C_SO, FA3_SO)]
            wheel.extractall(root, names)
            so, fa3 = wheel.read(C_SO), wheel.read(FA3_SO)
        with tarfile.open(gpu / "vllm.tar.xz", "w:xz") as tar:
            for top in sorted(p.name for p in root.iterdir()):
                tar.add(root / top, arcname=top)
        preset = args.preset | (lzma.PRESET_EXTREME if args.preset == 9 else 0)
        packed = lzma.compress(so, preset=preset)
        cut = args.first_part
        (gpu / "c.xz.0").write_bytes(packed[:cut])
        (gpu / "c.xz.1").write_bytes(packed[cut:])
        (gpu / "fa3.xz").write_bytes(lzma.compress(fa3, preset=preset))
        write_pfiles(root, gpu, Path(tmp) / "state")
    print(f"wrote {gpu}/vllm.tar.xz, c.xz.0, c.xz.1, fa3.xz, pfiles/")


def write_pfiles(root: Path, gpu: Path, state: Path) -> None:
    """`rlprobe-patch apply` (the repo's current patches) over the unpatched tree `root`; its three
    files to `gpu`/pfiles."""
    env = {**os.environ, "RLPROBE_PATCH_STATE_HOME": str(state)}
    apply = [sys.executable, "-m", "rlprobe_patch", "apply", "--vllm-root", str(root), "--mode", "consistency"]
    subprocess.run(apply, check=True, env=env)
    shutil.rmtree(gpu / "pfiles", ignore_errors=True)
    for name in PATCHED_FILES:
        (gpu / "pfiles" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, gpu / "pfiles" / name)


def pfiles(args: argparse.Namespace) -> None:
    """.gpu/pfiles alone, from the unpatched tree `pack` wrote to .gpu/vllm.tar.xz."""
    gpu = Path(args.dest)
    with tempfile.TemporaryDirectory(prefix="vllm-gpu-pfiles-") as tmp:
        root = Path(tmp) / "root"
        with tarfile.open(args.tar or gpu / "vllm.tar.xz", "r:xz") as tar:
            tar.extractall(root, filter="data")
        write_pfiles(root, gpu, Path(tmp) / "state")
    print(f"wrote {gpu}/pfiles/: {', '.join(PATCHED_FILES)}")


# --------------------------------------------------------------------------------------------------
# On the device: build the two trees.


def prepare(args: argparse.Namespace) -> None:
    """Step by step, as the calls bring the parts: the Python tree, then each extension, then the twin."""
    dest = Path(args.dest)
    plain, patched = dest / "plain", dest / "patched"
    if args.tar and not (plain / "vllm").is_dir():
        plain.mkdir(parents=True, exist_ok=True)
        with tarfile.open(args.tar, "r:xz") as tar:
            tar.extractall(plain, filter="data")
    for target, parts in ((C_SO, args.so), (FA3_SO, args.fa3)):
        if parts:
            (plain / target).write_bytes(lzma.decompress(b"".join(Path(p).read_bytes() for p in parts)))
            (plain / target).chmod(0o755)
    if args.overlay:
        shutil.rmtree(patched, ignore_errors=True)
        shutil.copytree(plain, patched, symlinks=True)
        for name in PATCHED_FILES:
            shutil.copy2(Path(args.overlay) / name, patched / name)
    have = [name for name in (C_SO, FA3_SO) if (plain / name).is_file()]
    print(f"prepared {plain}{' and ' + str(patched) if args.overlay else ''}; extensions there: {have}")


def record_check(root: Path) -> dict[str, Any]:
    """The files of `root`'s vllm against the wheel's RECORD: differing, missing, added."""
    (record,) = root.glob("vllm-*.dist-info/RECORD")
    listed: set[str] = set()
    differ, missing = [], []
    for row in csv.reader(record.read_text().splitlines()):
        path, digest = row[0], row[1]
        if not path.startswith("vllm/") or not digest:
            continue
        listed.add(path)
        if not (root / path).is_file():
            missing.append(path)
            continue
        algo, _, value = digest.partition("=")
        ours = base64.urlsafe_b64encode(hashlib.new(algo, (root / path).read_bytes()).digest()).rstrip(b"=")
        if ours.decode() != value:
            differ.append(path)
    added = sorted(
        str(p.relative_to(root))
        for p in (root / "vllm").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and str(p.relative_to(root)) not in listed
    )
    return {"checked": len(listed) - len(missing), "differ": sorted(differ), "missing": missing, "added": added}


# --------------------------------------------------------------------------------------------------
# Models.


def make_models(work: Path, tiny_only: bool = False) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    sys.path.insert(0, str(HERE.parents[1] / "tests" / "runtime"))
    from vllm_driver import make_model  # the CPU runtime test's tiny Qwen2, the same seed

    make_model(work / "tiny")
    if tiny_only:  # no benchmark
        return
    torch.manual_seed(0)
    big = Qwen2Config(
        vocab_size=32000,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=8,
        num_attention_heads=16,
        num_key_value_heads=8,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    Qwen2ForCausalLM(big).to(torch.bfloat16).save_pretrained(work / "bench")


# --------------------------------------------------------------------------------------------------
# Children: one engine each, in the vLLM tree PYTHONPATH names.


def engine_kwargs(attention: str) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "enforce_eager": True,
        "skip_tokenizer_init": True,
        "seed": 0,
        # Several engines share the GPU: a fixed KV cache, no memory profiling against the others.
        "gpu_memory_utilization": 0.04,
        "kv_cache_memory_bytes": 1 << 30,
    }
    if attention != "auto":
        kwargs["attention_config"] = {"backend": attention}
    return kwargs


def runner_info(llm: Any) -> dict[str, Any]:
    import torch
    import vllm

    engine = llm.llm_engine
    info: dict[str, Any] = {
        "vllm": vllm.__version__,
        "vllm_commit": getattr(sys.modules.get("vllm._version"), "__commit_id__", None),
        "vllm_file": vllm.__file__,
        "C_ext": getattr(sys.modules.get("vllm._C_stable_libtorch"), "__file__", None),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
        "capability": list(torch.cuda.get_device_capability(0)),
    }
    config = engine.vllm_config
    info["use_v2_model_runner"] = bool(config.use_v2_model_runner)
    info["async_scheduling"] = config.scheduler_config.async_scheduling
    info["enabled_custom_ops"] = dict(config.compilation_config.enabled_custom_ops)
    info["disabled_custom_ops"] = dict(config.compilation_config.disabled_custom_ops)
    info["ir_op_priority"] = str(getattr(config.kernel_config, "ir_op_priority", None))
    try:
        runner = engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
        module = type(runner).__module__
        path = Path(sys.modules[module].__file__ or "")
        info["runner"] = f"{module}.{type(runner).__qualname__}"
        info["runner_file"] = str(path)
        info["runner_hooked"] = "rlprobe-patch" in path.read_text()
        info["msprobe_debugger"] = type(getattr(runner, "msprobe_debugger", None)).__name__
        backends = {type(layer.impl).__name__ for layer in runner.model.modules() if hasattr(layer, "impl")}
        info["attention_impls"] = sorted(backends)
    except Exception as exc:  # the report says what could not be read
        info["runner_error"] = f"{type(exc).__name__}: {exc}"
    return info


def proof_child(args: argparse.Namespace) -> None:
    try:
        from vllm import LLM, SamplingParams

        started = time.monotonic()
        extra = {"additional_config": {"dump_config_path": args.dump_config}} if args.dump_config else {}
        llm = LLM(
            model=args.model,
            dtype=args.dtype,
            max_model_len=128,
            max_num_seqs=16,
            max_num_batched_tokens=256,
            **engine_kwargs(args.attention),
            **extra,
        )
        ready = time.monotonic()
        engine = llm.llm_engine
        params = SamplingParams(max_tokens=MAX_TOKENS, logprobs=0, temperature=0, detokenize=False)
        import uuid

        ids = [uuid.UUID(int=1000 + i).hex for i in range(len(PROMPT_LENGTHS))]  # verl's spelling
        prompts = {rid: list(range(7 + i, 7 + i + n)) for i, (rid, n) in enumerate(zip(ids, PROMPT_LENGTHS))}
        for rid in ids:
            engine.add_request(rid, {"prompt_token_ids": prompts[rid]}, params)
        tokens: dict[str, list[int]] = {}
        logprobs: dict[str, list[float]] = {}
        steps = with_output = 0
        while engine.has_unfinished_requests():
            steps += 1
            outputs = engine.step()
            with_output += bool(outputs)
            for out in outputs:
                if out.finished:
                    completion = out.outputs[0]
                    tokens[out.request_id] = list(completion.token_ids)
                    logprobs[out.request_id] = [
                        float(entry[token].logprob) for entry, token in zip(completion.logprobs, completion.token_ids)
                    ]
        result: dict[str, Any] = {
            "ok": True,
            "request_ids": ids,
            "prompts": prompts,
            "tokens": tokens,
            "logprobs": logprobs,
            "engine_steps": steps,
            "steps_with_output": with_output,
            "startup_s": round(ready - started, 2),
            "generate_s": round(time.monotonic() - ready, 4),
            "msprobe_imported": "msprobe" in sys.modules,
            **runner_info(llm),
        }
    except BaseException as exc:  # the engine refused to start or failed: the report says why
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # the engine's background threads must not keep the process


def bench_child(args: argparse.Namespace) -> None:
    """One engine, driven from stdin, one `@@` line on stdout per command: `add` (a run's requests
    and its prefill), `step` (one decode step, timed), `end` (the run's figures)."""
    if args.cpus:  # before torch starts its threads: each engine on its own cores
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=args.model,
        dtype="bfloat16",
        max_model_len=256,
        max_num_seqs=args.prompts,
        max_num_batched_tokens=2048,
        enable_prefix_caching=False,
        # Synchronous steps: with async scheduling a step returns with its batch still on the GPU,
        # which would overlap the other engine's step in the interleaved timing.
        async_scheduling=False,
        **engine_kwargs(args.attention),
    )
    engine = llm.llm_engine
    params = SamplingParams(max_tokens=args.tokens, temperature=0, ignore_eos=True, detokenize=False)
    print("@@READY " + json.dumps(runner_info(llm)), flush=True)
    run = 0
    durations: list[float] = []
    for line in sys.stdin:
        command = line.strip()
        if command == "add":
            run += 1
            for i in range(args.prompts):
                prompt = {"prompt_token_ids": list(range(100 + i, 116 + i))}
                engine.add_request(f"{run:04d}{i:028x}", prompt, params)
            engine.step()  # the prefill (and each request's first token)
            durations = []
            print("@@OK {}", flush=True)
        elif command == "step":
            started = time.perf_counter()
            engine.step()
            durations.append(time.perf_counter() - started)
            print("@@STEP " + json.dumps({"more": engine.has_unfinished_requests()}), flush=True)
        elif command == "end":
            ordered = sorted(durations)
            result = {
                "decode_tokens_per_s": args.prompts * len(durations) / sum(durations),
                "mean_step_ms": sum(durations) / len(durations) * 1e3,
                "median_step_ms": statistics.median(durations) * 1e3,
                "p10_p90_step_ms": [ordered[len(ordered) // 10] * 1e3, ordered[len(ordered) * 9 // 10] * 1e3],
                "median_step_tokens_per_s": args.prompts / statistics.median(durations),
                "steps": len(durations),
                "msprobe_imported": "msprobe" in sys.modules,
            }
            print("@@RESULT " + json.dumps(result), flush=True)
        else:
            break
    sys.stdout.flush()
    os._exit(0)


# --------------------------------------------------------------------------------------------------
# The orchestrator.


def child_env(tree: Path, runner: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DUMP_ON", "PROMPTS_ONLY", "DUMP_PHASE")}
    site = os.environ.get("PYTHONPATH", "")
    env.update(
        {
            "PYTHONPATH": f"{tree}:{site}" if site else str(tree),
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "VLLM_USE_V2_MODEL_RUNNER": RUNNERS[runner],
            "VLLM_LOGGING_STREAM": "ext://sys.stderr",
            # flashinfer-python is not carried: vLLM's own switch for its top-k/top-p sampler (greedy
            # decoding does not use it; without the switch the sampler's probe imports flashinfer).
            "VLLM_USE_FLASHINFER_SAMPLER": "0",
            "VLLM_NO_USAGE_STATS": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def msprobe_config(path: Path, dump: Path, **task: object) -> str:
    config: dict[str, Any] = {
        "task": "statistics",
        "dump_path": str(dump),
        "rank": [],
        "step": [],
        "level": "L0",
        "async_dump": False,
    }
    if task:
        config["statistics"] = task
    path.write_text(json.dumps(config))
    return str(path)


def dumped_steps(dump: Path) -> dict[int, dict[str, Any]]:
    return {
        int(p.parent.parent.name[len("step") :]): json.loads(p.read_text())["data"]
        for p in dump.glob("step*/rank0/dump.json")
    }


def embedding_rows(data: dict[str, Any]) -> int:
    (key,) = [k for k in data if ".embed_tokens." in k and k.endswith("forward.0")]
    return int(data[key]["output"][0]["shape"][0])


def strip(rid: str) -> str:
    return SUFFIX.sub("", rid)


class Checks:
    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def __call__(self, name: str, ok: bool, detail: object = "") -> bool:
        self.items.append({"check": name, "ok": bool(ok), "detail": str(detail)[:600]})
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {str(detail)[:300]}", flush=True)
        return bool(ok)


def start_proofs(root: Path, work: Path, args: argparse.Namespace) -> dict[tuple[str, str], Any]:
    procs: dict[tuple[str, str], Any] = {}
    for runner in args.runners.split(","):
        on = msprobe_config(work / f"{runner}-on.json", work / f"{runner}-dump")
        wanted = "000000000000000000000000000003ea"  # uuid.UUID(int=1002).hex: the third prompt
        sliced = msprobe_config(work / f"{runner}-sliced.json", work / f"{runner}-sliced", request_id=wanted)
        cases: dict[str, tuple[Path, list[str]]] = {
            "unpatched": (root / "plain", []),
            "off": (root / "patched", []),
            "on": (root / "patched", ["--dump-config", on]),
            "sliced": (root / "patched", ["--dump-config", sliced]),
        }
        for name, (tree, extra) in cases.items():
            out = work / f"{runner}-{name}.json"
            cmd = [sys.executable, str(HERE), "proof-child", "--model", str(work / "tiny"), "--out", str(out), *extra]
            cmd += ["--dtype", args.proof_dtype, "--attention", args.attention]
            log = open(work / f"{runner}-{name}.log", "w")
            proc = subprocess.Popen(
                cmd, env=child_env(tree, runner), cwd=work, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            procs[(runner, name)] = (proc, log, out)
    return procs


def wait_proofs(procs: dict[tuple[str, str], Any], deadline: float) -> dict[tuple[str, str], dict[str, Any]]:
    results: dict[tuple[str, str], dict[str, Any]] = {}
    for key, (proc, log, out) in procs.items():
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            log.close()
        text = Path(log.name).read_text(errors="replace")
        result = json.loads(out.read_text()) if out.is_file() else {"ok": False, "error": "no result (timeout?)"}
        result["log"] = text
        results[key] = result
    return results


def check_runner(runner: str, res: dict[str, dict[str, Any]], work: Path, checks: Checks, full: bool) -> dict[str, Any]:
    """The CPU runtime test's assertions, on one runner's unpatched/off/on(/sliced) results."""
    summary: dict[str, Any] = {}
    for name, result in res.items():
        if not checks(
            f"{runner} {name}: engine ran", bool(result.get("ok")), result.get("error", result.get("runner"))
        ):
            summary[f"{name}_traceback"] = result.get("traceback", "")[-4000:]
    unpatched, off, on = res["unpatched"], res["off"], res["on"]
    if not (unpatched.get("ok") and off.get("ok") and on.get("ok")):
        return summary
    v2 = runner == "v2"
    expect_runner = "vllm.v1.worker.gpu.model_runner" if v2 else "vllm.v1.worker.gpu_model_runner"
    for name, result in res.items():
        if not result.get("ok"):
            continue
        checks(f"{runner} {name}: runner", result.get("runner", "").startswith(expect_runner), result.get("runner"))
        checks(
            f"{runner} {name}: hooked file iff patched",
            result.get("runner_hooked") == (name != "unpatched"),
            f"{result.get('runner_file')} hooked={result.get('runner_hooked')}",
        )
        logged_v2 = "Using V2 Model Runner" in result["log"]
        checks(f"{runner} {name}: 'Using V2 Model Runner' logged iff V2", logged_v2 == v2, logged_v2)
    ids = unpatched["request_ids"]
    checks(
        f"{runner} unpatched: every request done",
        sorted(unpatched["tokens"]) == sorted(ids) and unpatched["engine_steps"] >= 3,
        f"steps {unpatched['engine_steps']}",
    )
    # Off: the same tokens and logprobs, msprobe never imported, no hook line.
    same = (off["tokens"], off["logprobs"]) == (unpatched["tokens"], unpatched["logprobs"])
    diff = max(
        (abs(a - b) for rid in ids for a, b in zip(off["logprobs"].get(rid, []), unpatched["logprobs"].get(rid, []))),
        default=0.0,
    )
    checks(f"{runner} off: tokens and logprobs == unpatched (exact)", same, f"max |dlogprob| {diff}")
    checks(f"{runner} off: msprobe not imported", off["msprobe_imported"] is False, off["msprobe_imported"])
    checks(f"{runner} off: no rlprobe-patch line", "rlprobe-patch:" not in off["log"], "")
    checks(f"{runner} off: no debugger", off.get("msprobe_debugger") == "NoneType", off.get("msprobe_debugger"))
    # On.
    checks(f"{runner} on: tokens == unpatched", on["tokens"] == unpatched["tokens"], on["tokens"])
    on_diff = max(
        (abs(a - b) for rid in ids for a, b in zip(on["logprobs"].get(rid, []), unpatched["logprobs"].get(rid, []))),
        default=0.0,
    )
    summary["on_max_logprob_diff"] = on_diff
    checks(f"{runner} on: msprobe imported", on["msprobe_imported"] is True, on["msprobe_imported"])
    hook_line = [line for line in on["log"].splitlines() if HOOK_LINE in line]
    checks(f"{runner} on: hook line", bool(hook_line), hook_line[:1])
    dump = work / f"{runner}-dump"
    steps = dumped_steps(dump)
    logs = list(dump.glob("*/dispatch_log.jsonl"))
    if not checks(f"{runner} on: one dispatch log", len(logs) == 1, [str(p) for p in logs]):
        return summary
    every = [json.loads(line) for line in logs[0].read_text().splitlines()]
    summary["dispatch_log"] = every
    # The passes of the requests sent, and anything else: vLLM's own start-up passes (the V2 runner's
    # memory profile `_dummy_req_*` and kernel warm-up `_warmup_<i>_` go through execute_model; r1
    # dumped and logged them). A start-up pass dumped but not logged shows as a dump step of no line.
    lines = [r for r in every if r["request_ids"] and {strip(i) for i in r["request_ids"]} <= set(ids)]
    startup = [r for r in every if r not in lines]
    unlogged = sorted(set(steps) - {r["step"] for r in every})
    summary["startup_passes"] = [
        (r["step"], r["phase"], r["total_num_scheduled_tokens"], r["request_ids"][:2]) for r in startup
    ]
    summary["unlogged_dump_steps"] = [(n, embedding_rows(steps[n])) for n in unlogged]
    checks(
        f"{runner} on: no vLLM start-up pass dumped or logged",
        not startup and not unlogged,
        f"{len(startup)} logged"
        + "".join(
            f"; step {r['step']} {r['request_ids'][:1]}.. x{len(r['request_ids'])} "
            f"{r['phase']} {r['total_num_scheduled_tokens']} tokens"
            + (" (vLLM start-up)" if r["request_ids"] and all(STARTUP.match(i) for i in r["request_ids"]) else "")
            for r in startup
        )
        + f"; dump steps of no dispatch line: {summary['unlogged_dump_steps']}",
    )
    if not checks(f"{runner} on: dispatch lines of the requests", bool(lines), len(lines)):
        return summary
    summary["dump_steps"] = sorted(steps)
    summary["engine_steps"] = on["engine_steps"]
    summary["steps_with_output"] = on["steps_with_output"]
    prompts = on["prompts"]
    expected_tokens = sum(len(p) for p in prompts.values()) + len(prompts) * (MAX_TOKENS - 1)
    # All 4 fit one batch: the prefill (and each request's first token), then MAX_TOKENS - 1 decodes.
    passes = list(range(MAX_TOKENS))
    checks(
        f"{runner} on: msprobe steps 0..N-1, one per forward pass of the requests sent",
        sorted(steps) == passes and [r["step"] for r in every] == passes and len(lines) == len(every),
        f"dump steps {sorted(steps)}, dispatch steps {[r['step'] for r in every]}, request passes "
        f"{len(lines)} (expected {len(passes)}), engine.step() calls {on['engine_steps']} "
        f"({on['steps_with_output']} with output)",
    )
    checks(
        f"{runner} on: one forward pass per engine step with output",
        len(lines) == on["steps_with_output"],
        f"{len(lines)} passes, {on['steps_with_output']} steps with output, {on['engine_steps']} steps",
    )
    total = sum(r["total_num_scheduled_tokens"] for r in lines)
    checks(
        f"{runner} on: tokens scheduled in all passes == prompts + fed-back tokens",
        total == expected_tokens,
        f"{total} == {expected_tokens}",
    )
    rows = []
    for record in lines:
        ok_ids = all(re.fullmatch(r".+-[0-9a-f]{8}", r) for r in record["request_ids"])
        ok_ids = ok_ids and {strip(r) for r in record["request_ids"]} <= set(ids)
        checks(f"{runner} on: step {record['step']} ids = sent + -<8 hex>", ok_ids, record["request_ids"])
        checks(
            f"{runner} on: step {record['step']} total == sum",
            record["total_num_scheduled_tokens"] == sum(record["num_scheduled_tokens"].values()),
            record["num_scheduled_tokens"],
        )
        emb = embedding_rows(steps[record["step"]])
        rows.append((record["step"], record["phase"], emb, record["total_num_scheduled_tokens"]))
        checks(
            f"{runner} on: step {record['step']} embedding rows == tokens",
            emb == record["total_num_scheduled_tokens"],
            f"{emb} == {record['total_num_scheduled_tokens']}",
        )
        checks(
            f"{runner} on: step {record['step']} rank/tp/dp/source",
            (record["rank"], record["tp_rank"], record["dp_rank"], record["source"]) == (0, 0, 0, "dispatch"),
            (record["rank"], record["tp_rank"], record["dp_rank"], record["source"]),
        )
    summary["embedding_rows"] = rows
    first = lines[0]
    checks(
        f"{runner} on: first pass is the prefill of all 4",
        first["phase"] == "prefill"
        and first["prefill_request_ids"] == first["request_ids"]
        and {strip(r): n for r, n in first["num_scheduled_tokens"].items()} == {r: len(p) for r, p in prompts.items()},
        first["num_scheduled_tokens"],
    )
    checks(
        f"{runner} on: then decode, 1 token each",
        {r["phase"] for r in lines[1:]} == {"decode"}
        and all(set(r["num_scheduled_tokens"].values()) == {1} for r in lines[1:]),
        [(r["phase"], sorted(set(r["num_scheduled_tokens"].values()))) for r in lines[1:]],
    )
    if full and "sliced" in res and res["sliced"].get("ok"):
        wanted = "000000000000000000000000000003ea"
        sliced = work / f"{runner}-sliced"
        s_steps = dumped_steps(sliced)
        (s_log,) = sliced.glob("*/dispatch_log.jsonl")
        s_every = [json.loads(line) for line in s_log.read_text().splitlines()]
        summary["sliced_dispatch_log"] = s_every
        s_lines = [r for r in s_every if r["request_ids"] and {strip(i) for i in r["request_ids"]} <= set(ids)]
        summary["sliced_startup_passes"] = [
            (r["step"], r["total_num_scheduled_tokens"], r["request_ids"][:1], r.get("dumped_request_id"))
            for r in s_every
            if r not in s_lines
        ]
        summary["sliced_dump_steps"] = sorted(s_steps)
        checks(
            f"{runner} sliced: msprobe steps 0..N-1, one per forward pass of the requests sent",
            sorted(s_steps) == passes and [r["step"] for r in s_every] == passes and len(s_lines) == len(s_every),
            f"dump steps {sorted(s_steps)}, dispatch steps {[r['step'] for r in s_every]}, "
            f"start-up passes {summary['sliced_startup_passes']}",
        )
        checks(
            f"{runner} sliced: first pass names 4 requests, dumped one",
            len(s_lines[0]["request_ids"]) == 4 and strip(s_lines[0]["dumped_request_id"]) == wanted,
            s_lines[0].get("dumped_request_id"),
        )
        first_rows = embedding_rows(s_steps[s_lines[0]["step"]])
        checks(
            f"{runner} sliced: prefill rows == the wanted prompt's",
            first_rows == len(prompts[wanted]),
            f"{first_rows} of {s_lines[0]['total_num_scheduled_tokens']}",
        )
        later = [embedding_rows(s_steps[r["step"]]) for r in s_lines[1:]]
        summary["sliced_rows"] = [first_rows, *later]
        checks(f"{runner} sliced: decode rows == 1", all(n == 1 for n in later), later)
    return summary


class BenchWorker:
    def __init__(
        self, name: str, tree: Path, runner: str, work: Path, args: argparse.Namespace, cpus: str = ""
    ) -> None:
        self.name = name
        self.lines: queue.Queue[str] = queue.Queue()
        self.log = open(work / f"bench-{runner}-{name.split(',')[0]}.log", "w")
        cmd = [sys.executable, str(HERE), "bench-child", "--model", str(work / "bench")]
        cmd += ["--prompts", str(args.bench_prompts), "--tokens", str(args.bench_tokens), "--attention", args.attention]
        if cpus:
            cmd += ["--cpus", cpus]
        self.proc = subprocess.Popen(
            cmd,
            env=child_env(tree, runner),
            cwd=work,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            start_new_session=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.write(line)
            if line.startswith("@@"):
                self.lines.put(line)
        self.lines.put("@@EOF")

    def expect(self, tag: str, timeout: float) -> dict[str, Any]:
        line = self.lines.get(timeout=max(1.0, timeout))
        if not line.startswith(f"@@{tag} "):
            raise RuntimeError(f"{self.name}: expected {tag}, got {line.strip()} (see {self.log.name})")
        return dict(json.loads(line[len(tag) + 3 :]))

    def ask(self, command: str, tag: str, timeout: float = 120) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.expect(tag, timeout)

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.log.close()


def benchmark(
    workers: dict[str, dict[str, BenchWorker]], args: argparse.Namespace, checks: Checks, deadline: float
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for runner, pair in workers.items():
        info: dict[str, Any] = {}
        try:
            for name, worker in pair.items():
                info[name] = worker.expect("READY", min(300.0, deadline - time.monotonic()))
            interleaved_run(pair, list(pair))  # warm-up: kernels, allocator, clocks
            out[runner] = bench_pair(runner, pair, info, args, checks)
        except Exception as exc:
            checks(f"bench {runner}: engines up and runs done", False, exc)
            out[runner] = {"error": str(exc), "info": info}
    return out


def interleaved_run(pair: dict[str, BenchWorker], order: list[str]) -> dict[str, dict[str, Any]]:
    """One run of both engines, their decode steps alternating one by one: a slow spell of the
    machine (seconds long here) falls on both alike."""
    for name in order:
        pair[name].ask("add", "OK")
    more = dict.fromkeys(order, True)
    while any(more.values()):
        for name in order:
            if more[name]:
                more[name] = bool(pair[name].ask("step", "STEP")["more"])
    return {name: pair[name].ask("end", "RESULT") for name in order}


def bench_pair(
    runner: str, pair: dict[str, BenchWorker], info: dict[str, Any], args: argparse.Namespace, checks: Checks
) -> dict[str, Any]:
    names = list(pair)
    hooked = {name: i.get("runner_hooked") for name, i in info.items()}
    checks(f"bench {runner}: runner hooked iff patched", hooked == {names[0]: False, names[1]: True}, hooked)
    expect = "vllm.v1.worker.gpu.model_runner." if runner == "v2" else "vllm.v1.worker.gpu_model_runner."
    found = [i.get("runner", "") for i in info.values()]
    checks(f"bench {runner}: runner", all(r.startswith(expect) for r in found), found)
    per: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for i in range(args.bench_runs):
        order = names if i % 2 == 0 else names[::-1]  # which engine steps first alternates
        for name, result in interleaved_run(pair, order).items():
            per[name].append(result)
            print(f"bench {runner} run {i + 1} {name}: {result['decode_tokens_per_s']:.1f} tok/s", flush=True)
    medians = {name: statistics.median(r["decode_tokens_per_s"] for r in per[name]) for name in names}
    step_medians = {name: statistics.median(r["median_step_tokens_per_s"] for r in per[name]) for name in names}
    ratio = medians[names[1]] / medians[names[0]]
    paired = [b["decode_tokens_per_s"] / a["decode_tokens_per_s"] for a, b in zip(per[names[0]], per[names[1]])]
    checks(
        f"bench {runner}: dumping off never imports msprobe",
        not any(r["msprobe_imported"] for rs in per.values() for r in rs),
        "",
    )
    return {
        "info": info,
        "runs": per,
        "medians": medians,
        "ratio": ratio,
        "paired_ratio_median": statistics.median(paired),
        "median_step_medians": step_medians,
        # The fast decile of each run's steps, free of the machine's slow spells: median over the runs.
        "p10_step_ms_medians": {n: statistics.median(r["p10_p90_step_ms"][0] for r in per[n]) for n in names},
    }


def write_report(out: Path, summary: dict[str, Any], checks: Checks) -> str:
    lines = ["# vllm.model-runner + vllm.dispatch-logger on a GPU", ""]
    env = summary.get("environment", {})
    lines += [f"- {k}: {v}" for k, v in env.items()]
    lines += ["", "## Checks", "", "| check | ok | detail |", "|---|---|---|"]
    for item in checks.items:
        detail = item["detail"].replace("|", "/").replace("\n", " ")[:200]
        lines.append(f"| {item['check']} | {'yes' if item['ok'] else '**NO**'} | {detail} |")
    for runner, bench in summary.get("bench", {}).items():
        if "runs" not in bench:
            lines += ["", f"## Benchmark {runner}: {bench.get('error')}"]
            continue
        names = list(bench["runs"])
        lines += ["", f"## Benchmark, {runner} model runner (decode tokens/s of each run; mean step)", ""]
        lines += ["| run | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for i in range(len(bench["runs"][names[0]])):
            cells = [
                f"{bench['runs'][n][i]['decode_tokens_per_s']:.1f} ({bench['runs'][n][i]['mean_step_ms']:.3f} ms)"
                for n in names
            ]
            lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
        lines.append("| median | " + " | ".join(f"{bench['medians'][n]:.1f}" for n in names) + " |")
        lines += [
            "",
            f"ratio of medians (patched, dumping off / unpatched): {bench['ratio']:.4f}x; "
            f"median of the paired ratios: {bench['paired_ratio_median']:.4f}x",
            "",
            "decode tokens/s from each run's median step, median over the runs: "
            + ", ".join(f"{n} {v:.1f}" for n, v in bench.get("median_step_medians", {}).items()),
            "",
            "fast decile (p10) of each run's step times, median over the runs: "
            + ", ".join(f"{n} {v:.3f} ms" for n, v in bench.get("p10_step_ms_medians", {}).items()),
        ]
    text = "\n".join(lines) + "\n"
    (out / "report.md").write_text(text)
    return text


def orchestrate(args: argparse.Namespace) -> int:
    root, out = Path(args.root), Path(args.out)
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget_s
    checks = Checks()
    runners = args.runners.split(",")
    summary: dict[str, Any] = {"environment": {}, "runners": {}, "bench": {}}
    gpu = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip()
    summary["environment"]["nvidia-smi -L"] = gpu
    plain, patched = record_check(root / "plain"), record_check(root / "patched")
    left_out = sorted({"/".join(m.split("/")[:3]) for m in plain["missing"]})
    summary["record"] = {"plain": plain, "patched": patched}
    checks(
        "plain tree == the wheel's RECORD (what it holds)",
        not plain["differ"] and not plain["added"],
        f"{plain['checked']} files match; left out: {left_out}",
    )
    checks(
        "patched tree: only the patched files differ",
        patched["differ"] == sorted(PATCHED_FILES[1:]) and patched["added"] == [PATCHED_FILES[0]],
        f"differ {patched['differ']}, added {patched['added']}",
    )
    started = time.monotonic()
    if args.skip_bench:
        args.bench_runs, args.bench_reserve_s = 0, 0.0
    make = [sys.executable, str(HERE), "make-models", "--work", str(work)]
    subprocess.run(make + (["--tiny-only"] if args.bench_runs <= 0 else []), check=True)
    print(f"models made in {time.monotonic() - started:.1f}s", flush=True)
    procs = {} if args.skip_proof else start_proofs(root, work, args)
    workers: dict[str, dict[str, BenchWorker]] = {}
    cores = os.cpu_count() or 1
    for k, runner in enumerate(runners if args.bench_runs > 0 else []):
        # Each engine on 4 cores of its own where the machine has them (16 here).
        cpus = [",".join(str(c) for c in range(4 * n, 4 * n + 4)) if cores >= 16 else "" for n in (2 * k, 2 * k + 1)]
        workers[runner] = {
            "unpatched": BenchWorker("unpatched", root / "plain", runner, work, args, cpus[0]),
            "patched, dumping off": BenchWorker("patched, dumping off", root / "patched", runner, work, args, cpus[1]),
        }
    results = wait_proofs(procs, deadline - args.bench_reserve_s)
    print(f"proof engines done in {time.monotonic() - started:.1f}s", flush=True)
    for runner in runners:
        res = {name: results[(r, name)] for (r, name) in results if r == runner}
        if not res:
            continue
        try:
            found = check_runner(runner, res, work, checks, full=True)
        except Exception as exc:  # a check that could not even read its data fails, the rest goes on
            checks(f"{runner}: checks ran", False, traceback.format_exc()[-500:])
            found = {"error": f"{type(exc).__name__}: {exc}"}
        summary["runners"][runner] = {
            "results": {n: {k: v for k, v in r.items() if k != "log"} for n, r in res.items()},
            **found,
        }
        first_ok = next((r for r in res.values() if r.get("ok")), None)
        if first_ok:
            for key in ("vllm", "vllm_commit", "C_ext", "torch", "gpu", "capability", "async_scheduling"):
                summary["environment"][f"{runner}: {key}"] = first_ok.get(key)
            summary["environment"][f"{runner}: custom ops enabled / disabled"] = (
                f"{first_ok.get('enabled_custom_ops')} / {first_ok.get('disabled_custom_ops')}"
            )
            summary["environment"][f"{runner}: attention impls"] = first_ok.get("attention_impls")
    write_artifacts(out, work, runners, summary, checks)  # in case the benchmark runs out of time
    try:
        if workers:
            summary["bench"] = benchmark(workers, args, checks, deadline)
    finally:
        for pair in workers.values():
            for worker in pair.values():
                worker.close()
    write_artifacts(out, work, runners, summary, checks)
    print(write_report(out, summary, checks))
    print(f"{len(checks.items)} checks, {len(summary['failed'])} failed: {summary['failed']}")
    return 1 if summary["failed"] else 0


def write_artifacts(out: Path, work: Path, runners: list[str], summary: dict[str, Any], checks: Checks) -> None:
    key = re.compile(r"rlprobe-patch|Model Runner|model runner|backend|Traceback|Error|error|WARNING")
    with open(out / "logs.txt", "w") as sink:
        for log in sorted(work.glob("*.log")):
            text = log.read_text(errors="replace").splitlines()
            sink.write(f"===== {log.name}: key lines\n")
            sink.writelines(line[:400] + "\n" for line in text if key.search(line))
            sink.write(f"----- {log.name}: last 40 lines\n")
            sink.writelines(line[:400] + "\n" for line in text[-40:])
    with tarfile.open(out / "logs_full.tar.gz", "w:gz") as tar:
        for log in sorted(work.glob("*.log")):
            tar.add(log, arcname=log.name)
    for runner in runners:
        data = summary["runners"].get(runner, {}).get("dispatch_log")
        if data:
            (out / f"dispatch_{runner}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))
        step0 = work / f"{runner}-dump" / "step0" / "rank0" / "dump.json"
        if step0.is_file():
            shutil.copy2(step0, out / f"dump_{runner}_step0.json")
    summary["checks"] = checks.items
    summary["failed"] = [c["check"] for c in checks.items if not c["ok"]]
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    write_report(out, summary, checks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="here: .gpu/vllm.tar.xz, c.xz.0, c.xz.1, pfiles from the vLLM wheel")
    p.add_argument("--wheel", required=True)
    p.add_argument("--dest", default=".gpu")
    p.add_argument("--first-part", type=int, default=31_000_000, help="bytes of the compressed _C in c.xz.0")
    p.add_argument("--preset", type=int, default=9, help="xz preset (9: 85 MB for _C, 8 MB for FA3; minutes)")
    sub.add_parser("wheels", help="here: print the pip command that fetches WHEELS into .gpu/whl")
    p = sub.add_parser("pfiles", help="here: .gpu/pfiles alone (the current patches), from .gpu/vllm.tar.xz")
    p.add_argument("--dest", default=".gpu")
    p.add_argument("--tar", help="the unpatched tree (default: DEST/vllm.tar.xz)")
    p = sub.add_parser("prepare", help="device: DEST/plain and DEST/patched")
    p.add_argument("--dest", required=True)
    p.add_argument("--tar", help=".gpu/vllm.tar.xz: extracted once into DEST/plain")
    p.add_argument("--overlay", help=".gpu/pfiles: DEST/patched = DEST/plain + these files")
    p.add_argument("--so", nargs="*", help="the parts of the xz-compressed _C_stable_libtorch")
    p.add_argument("--fa3", nargs="*", help="the parts of the xz-compressed _vllm_fa3_C")
    for name in ("all",):
        p = sub.add_parser(name, help="device: the proof and the benchmark")
        p.add_argument("--root", required=True, help="the DEST of prepare")
        p.add_argument("--attention", default="auto", help="vLLM's attention backend (auto: its own choice)")
        p.add_argument("--proof-dtype", default="bfloat16")
        p.add_argument("--out", required=True)
        p.add_argument("--work", default="/tmp/vllm-gpu-work")
        p.add_argument("--runners", default="v1,v2")
        p.add_argument("--bench-runs", type=int, default=7)
        p.add_argument("--skip-proof", action="store_true", help="the benchmark alone")
        p.add_argument("--skip-bench", action="store_true", help="the proof alone (--bench-runs 0)")
        p.add_argument("--bench-prompts", type=int, default=32)
        p.add_argument("--bench-tokens", type=int, default=128)
        p.add_argument("--budget-s", type=float, default=540)
        p.add_argument("--bench-reserve-s", type=float, default=150)
    p = sub.add_parser("make-models")
    p.add_argument("--work", required=True)
    p.add_argument("--tiny-only", action="store_true", help="the proof's model alone")
    p = sub.add_parser("proof-child")
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--dump-config")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--attention", default="auto")
    p = sub.add_parser("bench-child")
    p.add_argument("--model", required=True)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--attention", default="auto")
    p.add_argument("--cpus", default="", help="comma-separated cores to pin the engine to")
    args = parser.parse_args()
    if args.cmd == "pack":
        pack(args)
    elif args.cmd == "wheels":
        platforms = " ".join(f"--platform manylinux_2_{n}_x86_64" for n in (5, 17, 24, 26, 27, 28, 31, 34))
        print(
            "python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "
            f"--platform manylinux2014_x86_64 --platform manylinux1_x86_64 {platforms} -d .gpu/whl {WHEELS}"
        )
    elif args.cmd == "pfiles":
        pfiles(args)
    elif args.cmd == "prepare":
        prepare(args)
    elif args.cmd == "make-models":
        make_models(Path(args.work), args.tiny_only)
    elif args.cmd == "proof-child":
        proof_child(args)
    elif args.cmd == "bench-child":
        bench_child(args)
    else:
        sys.exit(orchestrate(args))


if __name__ == "__main__":  # vLLM starts subprocesses: importable without running
    main()
