"""The rollout engine's own record of each request: what it received and what it produced.

The capture holds the training side's view of every sample (the prompt and response ids it scored).
A prompt the rollout engine saw differently (another chat template, another tokenization, a
truncation) then looks like a numerics problem in the log-probs. The engine's record is the other
half of the identity check: the report joins it with the capture, request by request, and names a
request whose ids differ before it reads any number (`identity.py`).

The format, version 1: JSON lines, files named `*.rlprobe-rollout.jsonl` (`SUFFIX`), written by the
code `vllm.rollout-record` inserts into vLLM's scheduler (one line per finished request, appended by
each engine process to a file of its own), or by anything else that knows the same facts:

| key | type | |
|---|---|---|
| `format` | str | `"rlprobe-rollout"` (`FORMAT`) |
| `format_version` | int | `1` (`FORMAT_VERSION`) |
| `engine` | str | `"vllm"`, `"sglang"`, ... |
| `engine_version` | str | the engine's release |
| `request_id` | str | the id as the engine ran it (vLLM >= 0.14 appends `-<8 hex>`: stripped when joining) |
| `prompt_ids` | list of int | the prompt token ids the engine received |
| `output_ids` | list of int | the token ids it sampled |
| `finish_reason` | str or null | `"length"`, `"stop"`, `"abort"`, ... |
| `sampling` | object of scalars | the settings it applied (`temperature`, `top_p`, `top_k`, `min_p`, `seed`, ...) |
| `logprobs_mode` | str or null | the log-probs it returned (`raw_logprobs`, `processed_logprobs`, ...) |
| `dtype` | str | the dtype its forward computed in (`float32`, `bfloat16`, ...) |
| `model` | str | optional: the model it served (path or name) |
| `pid`, `time` | int, float | optional: the process and the time the line was written |

A record is untrusted input (it comes from the user's tree or cluster): a line that is not such an
object is refused, naming the file and the line.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlprobe_patch.base.errors import RefusedError

FORMAT = "rlprobe-rollout"
FORMAT_VERSION = 1
SUFFIX = ".rlprobe-rollout.jsonl"
MAX_LINE = 64 * 1024 * 1024  # characters: a prompt of a million tokens fits, a runaway file does not
MAX_SETTINGS = 4096  # characters of the `sampling` object
_SCALAR = (str, int, float, bool, type(None))
_ENGINE_SUFFIX = re.compile(r"-[0-9a-f]{8}$")  # vLLM >= 0.14 appends it to the id it was sent


@dataclass(frozen=True)
class RolloutRecord:
    """One request as the rollout engine saw it."""

    path: str  # file:line, for messages
    engine: str
    engine_version: str
    request_id: str  # as the engine ran it
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    finish_reason: str | None
    sampling: dict[str, Any]
    logprobs_mode: str | None
    dtype: str
    model: str = ""

    @property
    def sent_id(self) -> str:
        """The id the engine was sent (vLLM's `-<8 hex>` suffix stripped)."""
        return _ENGINE_SUFFIX.sub("", self.request_id)


def record_files(paths: list[Path]) -> list[Path]:
    """The rollout records in `paths` (files, or folders searched recursively)."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found += sorted(p for p in path.rglob(f"*{SUFFIX}") if p.is_file())
        elif path.name.endswith(SUFFIX):
            found.append(path)
    return found


def _ids(where: str, key: str, value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise RefusedError(f"{where}: {key} is not a list of token ids")
    return tuple(value)


def _text(where: str, key: str, value: Any, *, optional: bool = False) -> str:
    if value is None and optional:
        return ""
    if not isinstance(value, str) or len(value) > 4096:
        raise RefusedError(f"{where}: {key} is not a short string ({type(value).__name__})")
    return value


def parse_record(where: str, line: str) -> RolloutRecord:
    """One line of a record file, checked against the format; `RefusedError` naming `where` otherwise."""
    try:
        data = json.loads(line)  # a JSONDecodeError for text that is not JSON
    except (json.JSONDecodeError, RecursionError) as exc:
        raise RefusedError(
            f"{where}: not JSON ({getattr(exc, 'msg', 'nested too deep')})",
            hint="a line cut short (a process killed while writing?)",
        ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise RefusedError(f"{where}: not an {FORMAT} record (no format '{FORMAT}')")
    if data.get("format_version") != FORMAT_VERSION:
        raise RefusedError(
            f"{where}: {FORMAT} version {data.get('format_version')!r}; this rlprobe-patch reads {FORMAT_VERSION}",
            hint="read it with the rlprobe-patch release whose patch wrote it",
        )
    sampling = data.get("sampling", {})
    if (
        not isinstance(sampling, dict)
        or not all(isinstance(k, str) and isinstance(v, _SCALAR) for k, v in sampling.items())
        or len(json.dumps(sampling)) > MAX_SETTINGS
    ):
        raise RefusedError(f"{where}: sampling is not a short object of settings")
    reason = data.get("finish_reason")
    mode = data.get("logprobs_mode")
    return RolloutRecord(
        path=where,
        engine=_text(where, "engine", data.get("engine")),
        engine_version=_text(where, "engine_version", data.get("engine_version"), optional=True),
        request_id=_text(where, "request_id", data.get("request_id")),
        prompt_ids=_ids(where, "prompt_ids", data.get("prompt_ids")),
        output_ids=_ids(where, "output_ids", data.get("output_ids")),
        finish_reason=_text(where, "finish_reason", reason) if reason is not None else None,
        sampling=sampling,
        logprobs_mode=_text(where, "logprobs_mode", mode) if mode is not None else None,
        dtype=_text(where, "dtype", data.get("dtype")),
        model=_text(where, "model", data.get("model"), optional=True),
    )


def read_records(path: Path) -> list[RolloutRecord]:
    """Every record of one file; a blank line is skipped, anything else that is not a record is refused."""
    records: list[RolloutRecord] = []
    try:
        with path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if len(line) > MAX_LINE:
                    raise RefusedError(f"{path}:{number}: a line of more than {MAX_LINE} characters")
                if line.strip():
                    records.append(parse_record(f"{path}:{number}", line))
    except UnicodeDecodeError:
        raise RefusedError(f"{path}: not UTF-8 text (not an {FORMAT} record file)") from None
    except OSError as exc:
        raise RefusedError(f"{path}: not readable ({exc.strerror or exc})") from None
    return records
