"""The per-step log-prob capture file: one `.npz` per training step, written with numpy only.

A capture holds, for every sample of one training step (padding rows left out), what the
rollout engine and the training forward each said about the same response tokens. It is a
plain numpy archive (`numpy.savez`, no pickle: `numpy.load(..., allow_pickle=False)` reads it),
so that the code inserted into a user's verl tree needs nothing but numpy, and anyone can open
it by hand. Version 1, the arrays (N samples, R the padded response width of the step):

| key | dtype, shape | |
|---|---|---|
| `format` | str, () | `"rlprobe-logprobs"` (`FORMAT`) |
| `format_version` | int64, () | `1` (`FORMAT_VERSION`) |
| `step` | int64, () | the trainer's global step |
| `request_ids` | str, (N,) | the id `verl.request-id` sends (`""` where none) |
| `prompt_lengths` | int64, (N,) | prompt tokens (the attention mask's sum over the prompt) |
| `response_lengths` | int64, (N,) | valid response tokens (the response mask's sum) |
| `responses` | int64, (N, R) | the response token ids, padded |
| `response_mask` | bool, (N, R) | the tokens the loss counts (verl's `response_mask`) |
| `rollout_log_probs` | float32, (N, R) | the rollout engine's log-probs of those tokens |
| `old_log_probs` | float32, (N, R) | the training forward's (verl's `old_log_probs`) |
| `ref_log_prob` | float32, (N, R) | optional: the reference policy's |
| `dataset_index` | int64, (N,) | optional: the index verl carries (`extra_info.index`), -1 where none |
| `raw_prompts` | str, (N,) | optional: the raw prompt (a chat as JSON text, or the string) |
| `source` | str, () | optional: who wrote it (`"verl RayPPOTrainer"`) |
| `sampling` | str, () | optional: the rollout's sampling settings the run set, a JSON object of scalars |
| `prompt_ids` | int64, (N, P) | optional: the prompt ids the training side scored (row i: prompt_lengths[i] of them) |
| `provenance` | str, () | optional: what computed each side, as the writer knows it, a JSON object of scalars |
| `prefill_log_probs` | float32, (N, R) | optional: the rollout engine's re-score of the same tokens as a prefill |

`sampling` holds verl's `actor_rollout_ref.rollout` keys `temperature`, `top_p`, `top_k` and `logprobs_mode`
as the run's config holds them, defaults included (`{"temperature": 0.7, "logprobs_mode":
"processed_logprobs"}`): the report's diagnosis judges the log-probs' kind against them.

`prompt_ids` is the training side's half of the identity check: the report joins it, request by request,
with what the rollout engine itself recorded (`rollout_record.py`), so that a prompt the two sides saw
differently (a chat template, a tokenization, a truncation) is named as such, never read as numerics.
`provenance` says what computed each side where the writer knows it: `training_dtype` and
`rollout_dtype` (`"float32"`, `"bfloat16"`, ...), as the run's config sets them; the engine's own record
says what the rollout really ran. `prefill_log_probs` (the rollout engine re-scoring its own sampled
tokens as a prefill, vLLM's `prompt_logprobs`) splits the gap in two: the trainer against the
engine's prefill (two implementations of one computation), and the prefill against the decode that
sampled the tokens (cache, batch, kernels).

Files are named `step-<step:06d>.rlprobe-logprobs.npz` (`capture_name`) and written whole or not
at all (a temporary file in the same folder, then a rename).

`write_capture` is the one definition of the format: the tests and the demo write captures with it, and the
catalogue patch that captures on verl's side inserts the same steps (it cannot import rlprobe-patch in a user's
tree; the format is this docstring): given the same arrays, the two write the same bytes
(tests/unit/test_logprob_capture_payload.py). `read_capture` checks a file
against it and refuses, naming the file, what is not a capture of this version.
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from rlprobe_patch.base.errors import RefusedError

FORMAT = "rlprobe-logprobs"
FORMAT_VERSION = 1
SUFFIX = ".rlprobe-logprobs.npz"
_PER_TOKEN = ("responses", "response_mask", "rollout_log_probs", "old_log_probs")
_OPTIONAL_PER_TOKEN = ("ref_log_prob", "prefill_log_probs")
_REQUIRED = ("format", "format_version", "step", "request_ids", "prompt_lengths", "response_lengths", *_PER_TOKEN)


def capture_name(step: int) -> str:
    return f"step-{step:06d}{SUFFIX}"


def write_capture(
    directory: str | os.PathLike[str],
    *,
    step: int,
    request_ids: Sequence[str],
    prompt_lengths: Any,
    responses: Any,
    response_mask: Any,
    rollout_log_probs: Any,
    old_log_probs: Any,
    ref_log_prob: Any = None,
    dataset_index: Any = None,
    raw_prompts: Sequence[str] | None = None,
    keep: Any = None,
    source: str = "",
    sampling: dict[str, Any] | None = None,
    prompt_ids: Any = None,
    provenance: dict[str, Any] | None = None,
    prefill_log_probs: Any = None,
) -> str:
    """Write one step's capture into `directory`; returns its path.

    Array arguments are numpy arrays or anything `numpy.asarray` takes (a CPU tensor's
    `.numpy()`). `keep` (bool, (N,)) drops rows: the padding rows a trainer adds to divide the
    batch among its workers must not appear as requests.
    """
    rows = np.ones(len(request_ids), dtype=bool) if keep is None else np.asarray(keep, dtype=bool)
    mask = np.asarray(response_mask).astype(bool)[rows]
    arrays: dict[str, Any] = {
        "format": np.array(FORMAT),
        "format_version": np.array(FORMAT_VERSION, dtype=np.int64),
        "step": np.array(int(step), dtype=np.int64),
        "request_ids": np.array([str(r) for r in request_ids], dtype=str)[rows],
        "prompt_lengths": np.asarray(prompt_lengths, dtype=np.int64)[rows],
        "response_lengths": mask.sum(axis=1).astype(np.int64),
        "responses": np.asarray(responses, dtype=np.int64)[rows],
        "response_mask": mask,
        "rollout_log_probs": np.asarray(rollout_log_probs, dtype=np.float32)[rows],
        "old_log_probs": np.asarray(old_log_probs, dtype=np.float32)[rows],
    }
    # the optional arrays in the order the inserted writer (verl.logprob-capture's payload) puts them: the same
    # inputs give the same bytes (tests/unit/test_logprob_capture_payload.py)
    if source:
        arrays["source"] = np.array(source)
    if ref_log_prob is not None:
        arrays["ref_log_prob"] = np.asarray(ref_log_prob, dtype=np.float32)[rows]
    if dataset_index is not None:
        arrays["dataset_index"] = np.asarray(dataset_index, dtype=np.int64)[rows]
    if sampling is not None:
        arrays["sampling"] = np.array(json.dumps(sampling))
    if prompt_ids is not None:
        arrays["prompt_ids"] = np.asarray(prompt_ids, dtype=np.int64)[rows]
    if provenance is not None:
        arrays["provenance"] = np.array(json.dumps(provenance))
    if raw_prompts is not None:
        arrays["raw_prompts"] = np.array([str(p) for p in raw_prompts], dtype=str)[rows]
    if prefill_log_probs is not None:
        arrays["prefill_log_probs"] = np.asarray(prefill_log_probs, dtype=np.float32)[rows]
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, capture_name(int(step)))
    fd, tmp = tempfile.mkstemp(prefix=".step-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass
class TokenBatch:
    """One step's samples, from a capture or from slime's dumps: what the report reads."""

    path: str  # the file(s) it came from, for messages
    kind: str  # "verl-capture" | "slime"
    step: int | None
    request_ids: list[str]
    prompt_lengths: IntArray
    responses: IntArray  # (N, R)
    mask: BoolArray  # (N, R)
    rollout: FloatArray  # (N, R)
    training: FloatArray  # (N, R)
    ref: FloatArray | None = None
    dataset_index: IntArray | None = None
    raw_prompts: list[str] | None = None
    sampling: dict[str, Any] | None = None  # the rollout's settings the run wrote (`sampling`)
    source: str = ""  # who wrote it, as it says (`source`)
    prompt_ids: IntArray | None = None  # (N, P): what the training side scored, row i's first prompt_lengths[i]
    provenance: dict[str, Any] | None = None  # what computed each side (`provenance`)
    prefill: FloatArray | None = None  # (N, R): the rollout engine's re-score as a prefill

    def prompt(self, row: int) -> IntArray | None:
        """The prompt token ids of `row` the training side scored, where the capture holds them."""
        if self.prompt_ids is None:
            return None
        return self.prompt_ids[row, : int(self.prompt_lengths[row])]

    @property
    def samples(self) -> int:
        return len(self.request_ids)


def check_finite(batch: TokenBatch) -> None:
    """`RefusedError` naming the file, the request and the token where a log-prob of a response token
    is NaN or infinite: no mismatch metric means anything over it (verl's would be NaN or inf too)."""
    sides = [("rollout", batch.rollout), ("training", batch.training)]
    sides += [("ref", batch.ref)] if batch.ref is not None else []
    for side, values in sides:
        bad = batch.mask & ~np.isfinite(values)
        if not bad.any():
            continue
        row, position = (int(i) for i in np.argwhere(bad)[0])
        raise RefusedError(
            f"{batch.path}: {int(bad.sum())} {side} log-prob(s) of response tokens are NaN or infinite; first: "
            f"request {batch.request_ids[row] or f'row {row}'}, response token {position} "
            f"(id {int(batch.responses[row, position])}) = {values[row, position]}",
            hint="a log-prob of -inf is a token its side gives probability 0 (sampling with top-k/top-p "
            "logprobs of the processed logits?); NaN a broken forward. No metric is defined over them",
        )


def read_capture(path: Path) -> TokenBatch:
    """A capture file checked against the format; `RefusedError` naming the file otherwise."""
    try:
        archive = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise RefusedError(f"{path}: no such file") from None
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as exc:
        raise RefusedError(
            f"{path}: not a readable rlprobe-logprobs capture ({type(exc).__name__}: {exc})",
            hint="a truncated file (a run that stopped while writing?) or another kind of file",
        ) from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise RefusedError(f"{path}: a single numpy array, not an rlprobe-logprobs capture (.npz)")
    with archive:
        try:
            data = {key: archive[key] for key in archive.files}
        except (zipfile.BadZipFile, EOFError, OSError, ValueError) as exc:
            raise RefusedError(f"{path}: truncated or damaged ({type(exc).__name__}: {exc})") from None
    if "format" not in data or str(data["format"]) != FORMAT:
        raise RefusedError(f"{path}: a numpy archive, but not an rlprobe-logprobs capture (no format '{FORMAT}')")
    version = int(data["format_version"]) if "format_version" in data else None
    if version != FORMAT_VERSION:
        raise RefusedError(
            f"{path}: capture format version {version}; this rlprobe-patch reads version {FORMAT_VERSION}",
            hint="read it with the rlprobe-patch release whose patch wrote it",
        )
    if "rollout_log_probs" not in data:
        raise RefusedError(
            f"{path}: the capture holds no rollout_log_probs",
            hint="the run had no rollout log-probs (verl: actor_rollout_ref.rollout.calculate_log_probs=True; "
            "not in bypass mode)",
        )
    missing = [key for key in _REQUIRED if key not in data]
    if missing:
        raise RefusedError(f"{path}: capture lacks {', '.join(missing)}")
    n = len(data["request_ids"])
    shape = data["responses"].shape
    if len(shape) != 2 or shape[0] != n:
        raise RefusedError(f"{path}: responses has shape {shape}, expected ({n}, R)")
    for key in (*_PER_TOKEN, *(k for k in _OPTIONAL_PER_TOKEN if k in data)):
        if data[key].shape != shape:
            raise RefusedError(f"{path}: {key} has shape {data[key].shape}, responses {shape}")
    for key in ("prompt_lengths", "response_lengths", "dataset_index", "raw_prompts"):
        if key in data and data[key].shape != (n,):
            raise RefusedError(f"{path}: {key} has shape {data[key].shape}, expected ({n},)")
    mask = data["response_mask"].astype(bool, copy=False)
    if not np.array_equal(mask.sum(axis=1), data["response_lengths"]):
        raise RefusedError(f"{path}: response_lengths disagree with response_mask")
    if "prompt_ids" in data:
        ids = data["prompt_ids"]
        if ids.ndim != 2 or ids.shape[0] != n or ids.dtype.kind not in "iu":
            raise RefusedError(f"{path}: prompt_ids has shape {ids.shape} ({ids.dtype}), expected ({n}, P) integers")
        if n and int(data["prompt_lengths"].max()) > ids.shape[1]:
            raise RefusedError(f"{path}: prompt_lengths reach past prompt_ids' width {ids.shape[1]}")
    return TokenBatch(
        path=str(path),
        kind="verl-capture",
        step=int(data["step"]),
        request_ids=[str(r) for r in data["request_ids"]],
        prompt_lengths=data["prompt_lengths"].astype(np.int64, copy=False),
        responses=data["responses"].astype(np.int64, copy=False),
        mask=mask,
        rollout=data["rollout_log_probs"].astype(np.float64),
        training=data["old_log_probs"].astype(np.float64),
        ref=data["ref_log_prob"].astype(np.float64) if "ref_log_prob" in data else None,
        dataset_index=data["dataset_index"].astype(np.int64, copy=False) if "dataset_index" in data else None,
        raw_prompts=[str(p) for p in data["raw_prompts"]] if "raw_prompts" in data else None,
        sampling=_settings(path, "sampling", data["sampling"]) if "sampling" in data else None,
        source=str(data["source"])[:200] if "source" in data and data["source"].shape == () else "",
        prompt_ids=data["prompt_ids"].astype(np.int64, copy=False) if "prompt_ids" in data else None,
        provenance=_settings(path, "provenance", data["provenance"]) if "provenance" in data else None,
        prefill=data["prefill_log_probs"].astype(np.float64) if "prefill_log_probs" in data else None,
    )


SAMPLING_MAX = 4096  # characters of the `sampling` (or `provenance`) text: a few settings, not a document


def _settings(path: Path, key: str, value: Any) -> dict[str, Any]:
    """The `sampling` or `provenance` text: a JSON object of settings, each a number, a string, a bool or null (a
    capture is untrusted input: anything else is refused, naming the file)."""
    text = str(value) if value.shape == () and value.dtype.kind == "U" else None
    try:
        parsed = json.loads(text) if text is not None and len(text) <= SAMPLING_MAX else None
    except ValueError:
        parsed = None
    scalar = (str, int, float, bool, type(None))
    if not isinstance(parsed, dict) or not all(isinstance(v, scalar) for v in parsed.values()):
        shown = repr(text[:80]) if text is not None else f"an array {value.dtype} {value.shape}"
        raise RefusedError(
            f"{path}: {key} is not a JSON object of settings ({shown})",
            hint=f"a capture's {key} is one string of at most {SAMPLING_MAX} characters, e.g. "
            '\'{"temperature": 1.0, "logprobs_mode": "raw_logprobs"}\'',
        )
    return parsed
