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

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rlprobe_patch.base.errors import RefusedError
from rlprobe_patch.dumps.slime import is_evaluation, read_slime_dumps


@dataclass
class SlimeDebugReport:
    files: list[dict[str, Any]] = field(default_factory=list)  # one summary per file
    rollouts: list[dict[str, Any]] = field(default_factory=list)  # per rollout id: dumps, samples, actor steps
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


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
    return [item["check"] for item in read_slime_dumps(files, python, timeout=600)]


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
        evaluation = is_evaluation(item["path"])
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
