"""Weight fingerprints from both sides after a weight sync: stale or half-synced weights named by tensor.

A weight sync copies the trainer's tensors into the rollout engine, cast to the engine's dtype. After it,
every tensor the engine holds must be, byte for byte, the trainer's tensor cast the same way. A
fingerprint per tensor on each side (a hash of its bytes in one dtype) says which tensors the sync
left behind without a layer compare: all of them (stale weights: the engine runs an earlier update),
some (a half-synced model), or none.

The format, version 1: one JSON object per file, files named `*.rlprobe-weights.json` (`SUFFIX`):

| key | type | |
|---|---|---|
| `format` | str | `"rlprobe-weights"` (`FORMAT`) |
| `format_version` | int | `1` |
| `side` | str | `"training"` or `"rollout"` |
| `engine` | str | who wrote it (`"verl FSDPEngineWithLMHead"`, `"vllm <its release>"`) |
| `step` | int or null | the training step whose sync it follows |
| `dtype` | str | the dtype the bytes were hashed in (the rollout engine's: the trainer casts as the sync does) |
| `tensors` | object | per tensor, by its Hugging Face name: `{"sha256": hex, "numel": int, "sum": float}` |

The names are the checkpoint's (Hugging Face) names: an engine that fuses tensors (vLLM's `qkv_proj`
holds q, k and v; `gate_up_proj` holds gate and up) splits them back along their output sizes before it
hashes, as check-dump's module mapping maps vLLM's modules to transformers'. `sum` (float64) is for a
person reading the file, and for two files of different dtypes, which cannot be compared by hash.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlprobe_patch.base.errors import RefusedError

FORMAT = "rlprobe-weights"
FORMAT_VERSION = 1
SUFFIX = ".rlprobe-weights.json"
MAX_BYTES = 64 * 1024 * 1024
SIDES = ("training", "rollout")


@dataclass(frozen=True)
class Fingerprint:
    sha256: str
    numel: int
    total: float  # the file's `sum`


@dataclass(frozen=True)
class Weights:
    """One side's fingerprints."""

    path: str
    side: str
    engine: str
    step: int | None
    dtype: str
    tensors: dict[str, Fingerprint]


def weight_files(paths: list[Path]) -> list[Path]:
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found += sorted(p for p in path.rglob(f"*{SUFFIX}") if p.is_file())
        elif path.name.endswith(SUFFIX):
            found.append(path)
    return found


def _fingerprint(where: str, value: Any) -> Fingerprint:
    if not isinstance(value, dict):
        raise RefusedError(f"{where}: not an object")
    sha, numel, total = value.get("sha256"), value.get("numel"), value.get("sum")
    if not isinstance(sha, str) or len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        raise RefusedError(f"{where}: sha256 is not 64 hex digits")
    if not isinstance(numel, int) or isinstance(numel, bool) or numel < 0:
        raise RefusedError(f"{where}: numel is not a count")
    if not isinstance(total, (int, float)) or isinstance(total, bool):
        raise RefusedError(f"{where}: sum is not a number")
    return Fingerprint(sha, numel, float(total))


def read_weights(path: Path) -> Weights:
    """One fingerprint file, checked against the format; `RefusedError` naming the file otherwise."""
    try:
        if path.stat().st_size > MAX_BYTES:
            raise RefusedError(f"{path}: larger than {MAX_BYTES} bytes: not a fingerprint file")
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise RefusedError(f"{path}: not a readable {FORMAT} file ({type(exc).__name__})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise RefusedError(f"{path}: not an {FORMAT} file (no format '{FORMAT}')")
    if data.get("format_version") != FORMAT_VERSION:
        raise RefusedError(f"{path}: {FORMAT} version {data.get('format_version')!r}; this reads {FORMAT_VERSION}")
    side, dtype, engine, step = data.get("side"), data.get("dtype"), data.get("engine", ""), data.get("step")
    if side not in SIDES:
        raise RefusedError(f"{path}: side is {side!r}, not one of {', '.join(SIDES)}")
    if not isinstance(dtype, str) or not isinstance(engine, str) or len(dtype) + len(engine) > 512:
        raise RefusedError(f"{path}: dtype and engine must be short strings")
    if step is not None and (not isinstance(step, int) or isinstance(step, bool)):
        raise RefusedError(f"{path}: step is not an integer")
    tensors = data.get("tensors")
    if not isinstance(tensors, dict):
        raise RefusedError(f"{path}: tensors is not an object")
    return Weights(
        path=str(path),
        side=side,
        engine=engine,
        step=step,
        dtype=dtype,
        tensors={str(name): _fingerprint(f"{path}: tensor {name}", v) for name, v in tensors.items()},
    )


@dataclass(frozen=True)
class WeightCompare:
    """The training side's fingerprints against the rollout's."""

    training: str
    rollout: str
    comparable: bool  # same dtype: hashes compare
    compared: int
    differing: list[str]  # in the training side's order
    missing: list[str]  # on the training side, not on the rollout's
    extra: list[str]  # on the rollout side only
    note: str = ""


def compare_weights(training: Weights, rollout: Weights) -> WeightCompare:
    """Which tensors differ between the two sides (by hash where the dtypes agree, else not compared)."""
    names = [n for n in training.tensors if n in rollout.tensors]
    missing = [n for n in training.tensors if n not in rollout.tensors]
    extra = [n for n in rollout.tensors if n not in training.tensors]
    if training.dtype != rollout.dtype:
        return WeightCompare(
            training.path,
            rollout.path,
            False,
            0,
            [],
            missing,
            extra,
            f"hashed in {training.dtype} on the training side and {rollout.dtype} on the rollout's: not compared",
        )
    differing = [n for n in names if training.tensors[n].sha256 != rollout.tensors[n].sha256]
    return WeightCompare(training.path, rollout.path, True, len(names), differing, missing, extra)
