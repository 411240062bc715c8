"""`check-dump --slime-debug`: slime's own debug dumps, tied to the msprobe actor steps.

slime saves what a rollout produced and what training received, with `torch.save`:

- `--save-debug-rollout-data PATH` (template with `{rollout_id}`; eval rollouts get
  `eval_<id>`): `{"rollout_id", "samples": [Sample.to_dict(), ...]}`, each sample with its
  `index` (slime's global sample counter) and `metadata`, where our rollout patch keeps the
  ids it sent SGLang (`rlprobe_request_ids`: `slime-<index>`, then `slime-<index>-<n>`);
- `--save-debug-train-data PATH` (`{rollout_id}`, `{rank}`), up to v0.3.1 one file per rank:
  `{"rollout_id", "rank", "rollout_data"}`, the rank's `rollout_data` with `sample_indices`
  (and `partition`, the rollout positions, where kept);
- after v0.3.1, one file per rollout (`format_version` 2): `{"format_version": 2, "rollout_id",
  "rank", "samples", "dp_shards", ...}`, samples sorted by their rollout position, and the
  positions each data-parallel rank trained on in `dp_shards`. Read from the documented
  structure (not from a release we hold): a sample's index is its `sample_index` / `index`, its
  position `rollout_position` / `partition`; a shard is a list of positions or a dict with
  `dp_rank` and `rollout_positions` / `positions` / `sample_indices`.

The files are pickles: they are opened with `torch.load(weights_only=True)` only (tensors and
plain data; nothing of the file runs), in the interpreter `--python` names (it needs torch).

The tie: the slime hook's `update_actor_log.jsonl` lines (`"framework": "slime"`) carry the
micro-batch's `sample_indices`, `request_ids` (`slime-<index>`) and, for training steps, the
`rollout_id`. Each sample of a rollout dump is matched with the actor steps that carried its
index; the request id the actor logs must be the first id the rollout sent for that sample.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlprobe_patch.base.errors import RefusedError
from rlprobe_patch.workflow.envprobe import run_python

_READER = r"""
import json, sys
import torch

def ints(value):
    if value is None:
        return None
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        try:
            return [int(v.item() if hasattr(v, "item") else v) for v in value]
        except (TypeError, ValueError):
            return None
    return None

def plain(value):
    if hasattr(value, "item") and getattr(value, "numel", lambda: 0)() == 1:
        value = value.item()
    return value if isinstance(value, (int, str, float)) or value is None else str(value)

def shards(value):
    out = []
    for rank, shard in enumerate(value or []):
        if isinstance(shard, dict):
            positions = next((shard[k] for k in ("rollout_positions", "positions", "partition") if k in shard), None)
            out.append({"dp_rank": plain(shard.get("dp_rank", rank)), "rollout_positions": ints(positions),
                        "sample_indices": ints(shard.get("sample_indices"))})
        else:
            out.append({"dp_rank": rank, "rollout_positions": ints(shard), "sample_indices": None})
    return out

results = []
for path in json.loads(sys.stdin.read()):
    item = {"path": path}
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        item["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}"
        results.append(item)
        continue
    if not isinstance(data, dict):
        item["error"] = f"holds a {type(data).__name__}, not slime's dict"
        results.append(item)
        continue
    item["keys"] = sorted(str(k) for k in data)
    item["rollout_id"] = plain(data.get("rollout_id"))
    item["rank"] = plain(data.get("rank"))
    item["format_version"] = plain(data.get("format_version"))
    if "rollout_data" in data:
        rd = data["rollout_data"] if isinstance(data["rollout_data"], dict) else {}
        item["kind"] = "train"
        item["sample_indices"] = ints(rd.get("sample_indices"))
        item["rollout_positions"] = ints(rd.get("partition"))
        item["rollout_data_keys"] = sorted(str(k) for k in rd)
    elif "samples" in data and data.get("format_version") is not None:
        item["kind"] = "train"
        samples = [s for s in data.get("samples") or [] if isinstance(s, dict)]
        item["sample_indices"] = [plain(s.get("sample_index", s.get("index"))) for s in samples]
        item["rollout_positions"] = [plain(s.get("rollout_position", s.get("partition"))) for s in samples]
        item["dp_shards"] = shards(data.get("dp_shards"))
    elif "samples" in data:
        item["kind"] = "rollout"
        item["samples"] = []
        for s in data.get("samples") or []:
            if not isinstance(s, dict):
                continue
            meta = s.get("metadata") if isinstance(s.get("metadata"), dict) else {}
            ids = meta.get("rlprobe_request_ids")
            item["samples"].append({"index": plain(s.get("index")), "status": plain(s.get("status")),
                                    "request_ids": [str(i) for i in ids] if isinstance(ids, list) else None})
    else:
        item["error"] = "neither a rollout dump (samples) nor a train dump (rollout_data, format_version)"
    results.append(item)
print(json.dumps(results))
"""

_EVAL = re.compile(r"(^|[^A-Za-z])eval_\d+")


@dataclass
class SlimeDebugReport:
    files: list[dict[str, Any]] = field(default_factory=list)  # one summary per file
    rollouts: list[dict[str, Any]] = field(default_factory=list)  # per rollout id: dumps, samples, actor steps
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"files": self.files, "rollouts": self.rollouts, "problems": self.problems, "notes": self.notes}


def debug_files(paths: list[Path]) -> list[Path]:
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found += sorted(p for p in path.rglob("*.pt") if p.is_file())
        elif path.is_file():
            found.append(path)
        else:
            raise RefusedError(f"--slime-debug {path}: no such file or directory")
    return found


def read_debug_files(files: list[Path], python: str | None) -> list[dict[str, Any]]:
    """Each file's summary, read by torch (weights_only) in `python`."""
    if not files:
        return []
    proc = run_python(python, _READER, timeout=600, stdin=json.dumps([str(f) for f in files]))
    for line in reversed(proc.stdout.strip().splitlines()):
        if line.startswith("["):
            summaries: list[dict[str, Any]] = json.loads(line)
            return summaries
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    raise RefusedError(
        f"cannot read slime's debug dumps: {tail}",
        hint="they are torch files: pass --python with the training environment's interpreter (it has torch)",
    )


def check_slime_debug(actor_log: list[dict[str, Any]], files: list[Path], python: str | None) -> SlimeDebugReport:
    report = SlimeDebugReport(files=read_debug_files(files, python))
    tie(report, actor_log)
    return report


def tie(report: SlimeDebugReport, actor_log: list[dict[str, Any]]) -> None:
    """Group the summaries per rollout and match their samples with the actor steps that carried them."""
    rollouts: dict[str, dict[str, Any]] = {}
    index_owner: dict[int, str] = {}  # sample index -> rollout (slime's index is a global counter)
    first_id: dict[int, str] = {}
    for item in report.files:
        if "error" in item:
            report.problems.append(f"{item['path']}: not read: {item['error']}")
            continue
        evaluation = bool(_EVAL.search(Path(item["path"]).name))
        key = f"eval_{item['rollout_id']}" if evaluation else str(item["rollout_id"])
        entry = rollouts.setdefault(
            key,
            {"rollout_id": item["rollout_id"], "evaluation": evaluation, "rollout_dumps": [], "train_dumps": []},
        )
        if item["kind"] == "rollout":
            samples = item["samples"]
            entry["rollout_dumps"].append(
                {
                    "path": item["path"],
                    "samples": len(samples),
                    "sample_indices": [s["index"] for s in samples],
                    "request_ids": {str(s["index"]): s["request_ids"] for s in samples},
                }
            )
            missing = [s["index"] for s in samples if not s["request_ids"]]
            if missing and not evaluation:
                report.notes.append(
                    f"{item['path']}: {len(missing)} of {len(samples)} sample(s) carry no rlprobe_request_ids "
                    "(the slime rollout patch that keeps them not applied, or DUMP_ON off in the rollout): "
                    "paired by index only"
                )
            if not evaluation:
                for s in samples:
                    if isinstance(s["index"], int):
                        index_owner[s["index"]] = key
                        if s["request_ids"]:
                            first_id[s["index"]] = s["request_ids"][0]
        else:
            train = {
                "path": item["path"],
                "format_version": item.get("format_version") or 1,
                "rank": item.get("rank"),
                "samples": len(item.get("sample_indices") or []),
                "sample_indices": item.get("sample_indices"),
                "rollout_positions": item.get("rollout_positions"),
            }
            if item.get("dp_shards") is not None:
                train["dp_shards"] = item["dp_shards"]
            if item.get("sample_indices") is None:
                report.notes.append(f"{item['path']}: no sample_indices in it (keys {item.get('rollout_data_keys')})")
            entry["train_dumps"].append(train)
            for index in item.get("sample_indices") or []:
                if isinstance(index, int) and not evaluation:
                    index_owner.setdefault(index, key)
    steps = [r for r in actor_log if r.get("framework") == "slime"]
    for entry in rollouts.values():
        entry["actor_steps"] = []
    carried: set[int] = set()
    for record in steps:
        indices = [i for i in record.get("sample_indices") or [] if isinstance(i, int)]
        owners = {index_owner[i] for i in indices if i in index_owner}
        step = {
            "log": record.get("_where"),
            "phase": record.get("phase"),
            "role": record.get("role"),
            "rollout_id": record.get("rollout_id"),
            "train_step": record.get("train_step"),
            "step": record.get("step"),
            "rank": record.get("rank"),
            "sample_indices": indices,
            "request_ids": record.get("request_ids") or [],
        }
        if not owners:
            if indices and rollouts:
                report.notes.append(f"{record.get('_where')}: samples {indices} are in none of the debug dumps given")
            continue
        for owner in sorted(owners):
            rollouts[owner]["actor_steps"].append(step)
            rid = rollouts[owner]["rollout_id"]
            if record.get("rollout_id") is not None and record.get("rollout_id") != rid:
                report.problems.append(
                    f"{record.get('_where')}: logged rollout {record.get('rollout_id')}, but its samples "
                    f"{indices} belong to rollout {rid}'s dumps"
                )
        carried.update(indices)
        for index, request_id in zip(indices, record.get("request_ids") or [], strict=False):
            sent = first_id.get(index)
            if sent is not None and sent != request_id:
                report.problems.append(
                    f"{record.get('_where')}: sample {index} logged as {request_id}, but the rollout sent {sent}"
                )
    for entry in rollouts.values():
        if entry["evaluation"]:
            continue
        indices = sorted(
            {i for d in entry["rollout_dumps"] for i in d["sample_indices"] if isinstance(i, int)}
            | {i for d in entry["train_dumps"] for i in d["sample_indices"] or [] if isinstance(i, int)}
        )
        entry["sample_indices"] = indices
        entry["not_in_actor_steps"] = [i for i in indices if i not in carried] if steps else indices
        if steps and entry["not_in_actor_steps"]:
            report.notes.append(
                f"rollout {entry['rollout_id']}: sample(s) {entry['not_in_actor_steps']} in no dumped actor step "
                "(DUMP_PHASE, msprobe's step list or another rank's dump path)"
            )
    report.rollouts = [rollouts[k] for k in sorted(rollouts, key=lambda k: (k.startswith("eval_"), _order(k)))]


def _order(key: str) -> tuple[int, str]:
    number = key.removeprefix("eval_")
    return (int(number), key) if number.isdigit() else (1 << 30, key)
