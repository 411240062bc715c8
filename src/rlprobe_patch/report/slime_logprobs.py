"""Per-sample log-probs from slime's debug dumps: the rollout's against training's, sample by sample.

The files are the ones `check-dump --slime-debug` reads (`workflow.slime_dumps`: found the same
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

import json
from pathlib import Path
from typing import Any

import numpy as np

from rlprobe_patch.base.errors import RefusedError
from rlprobe_patch.report.capture_format import TokenBatch
from rlprobe_patch.workflow.envprobe import run_python
from rlprobe_patch.workflow.slime_dumps import _EVAL

_READER = r"""
import json, sys
import torch

def floats(value):
    if value is None:
        return None
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        try:
            return [float(v) for v in value]
        except (TypeError, ValueError):
            return None
    return None

def ints(value):
    if value is None:
        return None
    if hasattr(value, "tolist"):
        value = value.tolist()
    try:
        return [int(v) for v in value]
    except (TypeError, ValueError):
        return None

def scalar(value):
    if hasattr(value, "item") and getattr(value, "numel", lambda: 0)() == 1:
        value = value.item()
    return value if isinstance(value, (int, float, str)) or value is None else str(value)

def text(value):
    if value is None or isinstance(value, str):
        return value
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return str(value)

def at(lst, i):
    return lst[i] if isinstance(lst, (list, tuple)) and i < len(lst) else None

out = []
for path in json.loads(sys.stdin.read()):
    item = {"path": path}
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        item["error"] = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"
        out.append(item); continue
    if not isinstance(data, dict):
        item["error"] = f"holds a {type(data).__name__}, not slime's dict"; out.append(item); continue
    item["rollout_id"] = scalar(data.get("rollout_id"))
    samples = []
    if "rollout_data" in data and isinstance(data["rollout_data"], dict):
        item["kind"], item["format_version"] = "train", 1
        rd = data["rollout_data"]
        indices = ints(rd.get("sample_indices")) or []
        positions = ints(rd.get("partition"))
        for i, index in enumerate(indices):
            samples.append({"sample_index": index, "rollout_position": at(positions, i) if positions else None,
                            "log_probs": floats(at(rd.get("log_probs"), i)),
                            "rollout_log_probs": floats(at(rd.get("rollout_log_probs"), i)),
                            "response_length": scalar(at(rd.get("response_lengths"), i)),
                            "tokens": ints(at(rd.get("tokens"), i))})
    elif "samples" in data and data.get("format_version") is not None:
        item["kind"], item["format_version"] = "train", scalar(data.get("format_version"))
        for s in data.get("samples") or []:
            if isinstance(s, dict):
                samples.append({"sample_index": scalar(s.get("sample_index", s.get("index"))),
                                "rollout_position": scalar(s.get("rollout_position", s.get("partition"))),
                                "log_probs": floats(s.get("log_probs")),
                                "rollout_log_probs": floats(s.get("rollout_log_probs")),
                                "response_length": scalar(s.get("response_length")),
                                "tokens": ints(s.get("tokens"))})
    elif "samples" in data:
        item["kind"] = "rollout"
        for position, s in enumerate(data.get("samples") or []):
            if isinstance(s, dict):
                meta = s.get("metadata") if isinstance(s.get("metadata"), dict) else {}
                ids = meta.get("rlprobe_request_ids")
                samples.append({"sample_index": scalar(s.get("index")), "rollout_position": position,
                                "rollout_log_probs": floats(s.get("rollout_log_probs")),
                                "response_length": scalar(s.get("response_length")),
                                "tokens": ints(s.get("tokens")), "prompt": text(s.get("prompt")),
                                "request_id": str(ids[0]) if isinstance(ids, list) and ids else None})
    else:
        item["error"] = "neither a rollout dump (samples) nor a train dump (rollout_data, format_version)"
    item["samples"] = samples
    out.append(item)
print(json.dumps(out))
"""


def read_slime_files(files: list[Path], python: str | None) -> list[dict[str, Any]]:
    proc = run_python(python, _READER, timeout=1800, stdin=json.dumps([str(f) for f in files]))
    for line in reversed(proc.stdout.strip().splitlines()):
        if line.startswith("["):
            items: list[dict[str, Any]] = json.loads(line)
            return items
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    more = f" and {len(files) - 1} more" if len(files) > 1 else ""
    raise RefusedError(
        f"cannot read slime's debug dumps ({files[0]}{more}): {tail}",
        hint="they are torch files: pass --python with the training environment's interpreter (it has torch)",
    )


def join_slime(items: list[dict[str, Any]]) -> tuple[list[TokenBatch], list[str]]:
    """One `TokenBatch` per (non-evaluation) rollout id that has a train dump; notes on what was left out."""
    notes: list[str] = []
    rollouts: dict[str, dict[str, Any]] = {}
    for item in items:
        if "error" in item:
            raise RefusedError(f"{item['path']}: not a slime debug dump: {item['error']}")
        if _EVAL.search(Path(item["path"]).name):
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
