"""slime's debug dumps (the files named on stdin, JSON), each loaded once by torch (`weights_only`) in this
interpreter and told apart by their keys: a train dump (`rollout_data`, or `samples` with a `format_version`) or a
rollout dump (`samples`). Per file two readings of the one load: `check`, what `check-dump --slime-debug` ties
(keys, ids, ranks, positions, shards, the rollout's statuses and request ids), and `logprobs`, what `report`
joins (each sample's log-probs on both sides, its tokens, prompt and request id). One JSON list."""

import json
import sys

import torch


def numbers(value, kind):
    """A tensor's or a list's values as `kind` (int, float); None where they are not numbers."""
    if value is None:
        return None
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        try:
            return [kind(v) for v in value]
        except (TypeError, ValueError):
            return None
    return None


def plain(value):
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


def shards(value):
    out = []
    for rank, shard in enumerate(value or []):
        if isinstance(shard, dict):
            positions = next((shard[k] for k in ("rollout_positions", "positions", "partition") if k in shard), None)
            out.append(
                {
                    "dp_rank": plain(shard.get("dp_rank", rank)),
                    "rollout_positions": numbers(positions, int),
                    "sample_indices": numbers(shard.get("sample_indices"), int),
                }
            )
        else:
            out.append({"dp_rank": rank, "rollout_positions": numbers(shard, int), "sample_indices": None})
    return out


def train_from_rollout_data(data, check, logprobs):
    rd = data["rollout_data"] if isinstance(data["rollout_data"], dict) else {}
    check["kind"] = "train"
    check["sample_indices"] = numbers(rd.get("sample_indices"), int)
    check["rollout_positions"] = numbers(rd.get("partition"), int)
    check["rollout_data_keys"] = sorted(str(k) for k in rd)
    if not isinstance(data["rollout_data"], dict):
        logprobs["error"] = f"its rollout_data holds a {type(data['rollout_data']).__name__}, not a dict"
        return
    logprobs["kind"], logprobs["format_version"] = "train", 1
    positions = numbers(rd.get("partition"), int)
    for i, index in enumerate(numbers(rd.get("sample_indices"), int) or []):
        logprobs["samples"].append(
            {
                "sample_index": index,
                "rollout_position": at(positions, i) if positions else None,
                "log_probs": numbers(at(rd.get("log_probs"), i), float),
                "rollout_log_probs": numbers(at(rd.get("rollout_log_probs"), i), float),
                "response_length": plain(at(rd.get("response_lengths"), i)),
                "tokens": numbers(at(rd.get("tokens"), i), int),
            }
        )


def train_from_samples(data, check, logprobs):
    samples = [s for s in data.get("samples") or [] if isinstance(s, dict)]
    check["kind"] = "train"
    check["sample_indices"] = [plain(s.get("sample_index", s.get("index"))) for s in samples]
    check["rollout_positions"] = [plain(s.get("rollout_position", s.get("partition"))) for s in samples]
    check["dp_shards"] = shards(data.get("dp_shards"))
    logprobs["kind"], logprobs["format_version"] = "train", plain(data.get("format_version"))
    for s in samples:
        logprobs["samples"].append(
            {
                "sample_index": plain(s.get("sample_index", s.get("index"))),
                "rollout_position": plain(s.get("rollout_position", s.get("partition"))),
                "log_probs": numbers(s.get("log_probs"), float),
                "rollout_log_probs": numbers(s.get("rollout_log_probs"), float),
                "response_length": plain(s.get("response_length")),
                "tokens": numbers(s.get("tokens"), int),
            }
        )


def rollout(data, check, logprobs):
    check["kind"] = logprobs["kind"] = "rollout"
    check["samples"] = []
    for position, s in enumerate(data.get("samples") or []):
        if not isinstance(s, dict):
            continue
        meta = s.get("metadata") if isinstance(s.get("metadata"), dict) else {}
        ids = meta.get("rlprobe_request_ids")
        check["samples"].append(
            {
                "index": plain(s.get("index")),
                "status": plain(s.get("status")),
                "request_ids": [str(i) for i in ids] if isinstance(ids, list) else None,
            }
        )
        logprobs["samples"].append(
            {
                "sample_index": plain(s.get("index")),
                "rollout_position": position,
                "rollout_log_probs": numbers(s.get("rollout_log_probs"), float),
                "response_length": plain(s.get("response_length")),
                "tokens": numbers(s.get("tokens"), int),
                "prompt": text(s.get("prompt")),
                "request_id": str(ids[0]) if isinstance(ids, list) and ids else None,
            }
        )


def read(path):
    check, logprobs = {"path": path}, {"path": path}
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        check["error"] = logprobs["error"] = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"
        return {"check": check, "logprobs": logprobs}
    if not isinstance(data, dict):
        check["error"] = logprobs["error"] = f"holds a {type(data).__name__}, not slime's dict"
        return {"check": check, "logprobs": logprobs}
    check["keys"] = sorted(str(k) for k in data)
    check["rollout_id"] = logprobs["rollout_id"] = plain(data.get("rollout_id"))
    check["rank"] = plain(data.get("rank"))
    check["format_version"] = plain(data.get("format_version"))
    logprobs["samples"] = []
    if "rollout_data" in data:
        train_from_rollout_data(data, check, logprobs)
    elif "samples" in data and data.get("format_version") is not None:
        train_from_samples(data, check, logprobs)
    elif "samples" in data:
        rollout(data, check, logprobs)
    else:
        check["error"] = logprobs["error"] = (
            "neither a rollout dump (samples) nor a train dump (rollout_data, format_version)"
        )
    logprobs["samples"] = logprobs.pop("samples")  # last, as report reads it
    return {"check": check, "logprobs": logprobs}


print(json.dumps([read(path) for path in json.loads(sys.stdin.read())]))
