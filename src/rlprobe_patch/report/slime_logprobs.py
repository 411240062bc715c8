"""Per-sample log-probs from slime's debug dumps: the rollout's against training's, sample by sample.

The files are the ones `check-dump --slime-debug` reads (`dumps.slime`: read by one probe, found the same
way, read with torch `weights_only=True` in `--python`):

- the rollout dump: `samples` in rollout order (a sample's position in that list is its rollout
  position), each with `index`, `tokens`, `response_length`, `rollout_log_probs`, `prompt` and
  `metadata["rlprobe_request_ids"]` where the slime request-id patch ran;
- the train dump, per rank up to v0.3.1 (`rollout_data`: lists per sample, `sample_indices`,
  `log_probs`, `rollout_log_probs`, `response_lengths`, `partition` where kept), or one file per
  rollout after it (`format_version` 2: `samples` sorted by `rollout_position`, each with
  `sample_index`, `log_probs`, ...).

Joined as slime's own end-to-end test joins them: by `rollout_position`, else by `sample_index`
(slime's global sample counter). Training's `log_probs` against the rollout's
`rollout_log_probs` (the rollout dump's, else the train dump's own copy).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from rlprobe_patch.base.errors import RefusedError
from rlprobe_patch.dumps.slime import is_evaluation, read_slime_dumps
from rlprobe_patch.report.capture_format import TokenBatch


def read_slime_files(files: list[Path], python: str | None) -> list[dict[str, Any]]:
    return [item["logprobs"] for item in read_slime_dumps(files, python, timeout=1800)]


def join_slime(items: list[dict[str, Any]]) -> tuple[list[TokenBatch], list[str]]:
    """One `TokenBatch` per (non-evaluation) rollout id that has a train dump; notes on what was left out."""
    notes: list[str] = []
    rollouts: dict[str, dict[str, Any]] = {}
    for item in items:
        if "error" in item:
            raise RefusedError(f"{item['path']}: not a slime debug dump: {item['error']}")
        if is_evaluation(item["path"]):
            notes.append(f"{item['path']}: an evaluation rollout: no training side, left out")
            continue
        entry = rollouts.setdefault(str(item["rollout_id"]), {"rollout": [], "train": []})
        entry[item["kind"]].append(item)
    batches = []
    for rollout_id, entry in sorted(rollouts.items(), key=lambda kv: kv[0]):
        if not entry["train"]:
            notes.append(f"rollout {rollout_id}: a rollout dump but no train dump: no training log-probs")
            continue
        by_position = {s["rollout_position"]: s for d in entry["rollout"] for s in d["samples"]}
        by_index = {s["sample_index"]: s for d in entry["rollout"] for s in d["samples"]}
        rows: list[dict[str, Any]] = []
        paths = [d["path"] for d in entry["rollout"] + entry["train"]]
        seen: set[Any] = set()
        for dump in entry["train"]:
            for sample in dump["samples"]:
                key = sample["sample_index"]
                if key in seen:  # the same sample in two ranks' files (v1: ranks of one data-parallel group)
                    continue
                seen.add(key)
                if sample["rollout_position"] is not None and sample["rollout_position"] in by_position:
                    rollout = by_position[sample["rollout_position"]]
                    if entry["rollout"] and rollout["sample_index"] != key:
                        raise RefusedError(
                            f"{dump['path']}: rollout position {sample['rollout_position']} holds sample "
                            f"{rollout['sample_index']} in the rollout dump, {key} in the train dump"
                        )
                else:
                    rollout = by_index.get(key, {})
                training = sample["log_probs"]
                rollout_lp = rollout.get("rollout_log_probs") or sample["rollout_log_probs"]
                if training is None:
                    raise RefusedError(
                        f"{dump['path']}: sample {key} has no training log_probs",
                        hint="slime keeps log_probs in the train dump when it computes them (no "
                        "--use-rollout-logprobs reuse) or captures them (format_version 2)",
                    )
                if rollout_lp is None:
                    raise RefusedError(
                        f"{dump['path']}: sample {key} has no rollout_log_probs, in neither dump",
                        hint="the rollout returned no log-probs",
                    )
                if len(training) != len(rollout_lp):
                    notes.append(
                        f"{dump['path']}: sample {key}: {len(training)} training log-probs, "
                        f"{len(rollout_lp)} rollout log-probs: left out"
                    )
                    continue
                tokens = rollout.get("tokens") or sample.get("tokens") or []
                response = tokens[len(tokens) - len(training) :] if len(tokens) >= len(training) else []
                rows.append(
                    {
                        "request_id": rollout.get("request_id") or f"slime-{key}",
                        "prompt": rollout.get("prompt"),
                        "prompt_length": max(0, len(tokens) - len(training)),
                        "training": training,
                        "rollout": rollout_lp,
                        "response": response if len(response) == len(training) else [-1] * len(training),
                    }
                )
        if not rows:
            continue
        width = max(len(r["training"]) for r in rows)
        n = len(rows)
        mask = np.zeros((n, width), dtype=bool)
        training_arr = np.zeros((n, width))
        rollout_arr = np.zeros((n, width))
        responses = np.full((n, width), -1, dtype=np.int64)
        for i, r in enumerate(rows):
            k = len(r["training"])
            mask[i, :k] = True
            training_arr[i, :k] = r["training"]
            rollout_arr[i, :k] = r["rollout"]
            responses[i, :k] = r["response"]
        prompts = [r["prompt"] for r in rows]
        batches.append(
            TokenBatch(
                path=", ".join(paths),
                kind="slime",
                step=int(rollout_id) if rollout_id.lstrip("-").isdigit() else None,
                request_ids=[r["request_id"] for r in rows],
                prompt_lengths=np.array([r["prompt_length"] for r in rows], dtype=np.int64),
                responses=responses,
                mask=mask,
                rollout=rollout_arr,
                training=training_arr,
                raw_prompts=[p or "" for p in prompts] if any(prompts) else None,
            )
        )
    return batches, notes
