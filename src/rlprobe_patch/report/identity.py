"""The identity check, before any number: did both sides see the same tokens, and run the same weights?

Request by request, the prompt and response ids the training side scored (the capture) are joined with what
the rollout engine itself recorded it received and produced (`rollout_record.py`, by request id). A request
whose ids differ is named as such, with the first position where they part and what the difference looks
like, and leaves the numbers: its log-probs are of other tokens, so no numeric diagnosis of them means
anything. Per step, the settings the engine applied (temperature, top-p, top-k, log-probs mode, dtype) come
from the same records: what it really ran, not what a config said.

Weight fingerprints (`weights.py`) from both sides after a weight sync name the tensors the engine holds that
differ from the trainer's: stale or half-synced weights, with no layer compare.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from rlprobe_patch.report.capture_format import TokenBatch
from rlprobe_patch.report.rollout_record import RolloutRecord
from rlprobe_patch.report.weights import WeightCompare, Weights, compare_weights

SHOWN = 5  # requests or tensors named one by one


@dataclass(frozen=True)
class Difference:
    """Where one request's ids differ between the sides."""

    request_id: str
    row: int
    part: str  # "prompt" or "response"
    kind: str  # "template", "truncation", "tokenization", "token"
    position: int  # the first position (in the part) where they part
    training: int  # the training side's length of the part
    engine: int  # the engine's
    said: str


def _contains(longer: tuple[int, ...], shorter: tuple[int, ...]) -> bool:
    """Whether `shorter` is a contiguous run of `longer` (the text inside a chat template's wrapping)."""
    n = len(shorter)
    if not n:
        return True
    first = shorter[0]
    return any(longer[i : i + n] == shorter for i in range(len(longer) - n + 1) if longer[i] == first)


def _first_difference(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def compare_prompt(rid: str, row: int, training: tuple[int, ...], engine: tuple[int, ...]) -> Difference | None:
    if training == engine:
        return None
    at = _first_difference(training, engine)
    lengths = f"the training side scored {len(training)} prompt tokens, the engine received {len(engine)}"
    if at == min(len(training), len(engine)):
        kind, why = "truncation", "one is the other cut short (max_prompt_length? a truncation side?)"
    elif _contains(engine, training) or _contains(training, engine):
        kind, why = "template", "one wraps the other's tokens in more (a chat template applied on one side only?)"
    else:
        kind, why = "tokenization", "the same length of text in other ids (another tokenizer or tokenization?)"
    said = f"prompt differs from position {at} ({lengths}): {kind}: {why}"
    return Difference(rid, row, "prompt", kind, at, len(training), len(engine), said)


def compare_response(rid: str, row: int, training: tuple[int, ...], engine: tuple[int, ...]) -> Difference | None:
    if training == engine:
        return None
    at = _first_difference(training, engine)
    if at == min(len(training), len(engine)):
        kind = "truncation"
        said = (
            f"response: the training side scored {len(training)} tokens, the engine produced {len(engine)}, the same "
            "up to there (max_response_length? an EOS token kept or dropped?)"
        )
    else:
        kind = "token"
        said = (
            f"response token {at} differs (engine id {engine[at]}, training side id {training[at]}): a detokenize / "
            "retokenize round trip, or another response?"
        )
    return Difference(rid, row, "response", kind, at, len(training), len(engine), said)


@dataclass
class StepIdentity:
    """One step's identity check: which requests were joined with a record, which differ, what the engine ran."""

    step: int | None
    requests: int
    joined: int  # requests with an engine record
    prompts_compared: int  # of them, with the training side's prompt ids in the capture
    differences: list[Difference] = field(default_factory=list)
    engine: dict[str, Any] = field(default_factory=dict)  # what the engine applied: one value, or "mixed: ..."
    weights: WeightCompare | None = None

    @property
    def differing_rows(self) -> set[int]:
        return {d.row for d in self.differences}

    @property
    def checked(self) -> bool:
        return self.joined > 0

    def summary(self) -> str:
        if not self.joined:
            return "no rollout record joined (the engine's record: vllm.rollout-record, MISMATCH_ON)"
        rows = self.differing_rows
        if not rows:
            what = "prompt and response ids" if self.prompts_compared == self.joined else "response ids"
            return f"the {what} of all {self.joined} joined request(s) are the engine's"
        kinds = Counter(f"{d.part} {d.kind}" for d in self.differences)
        return (
            f"{len(rows)} of {self.joined} joined request(s) differ ("
            + ", ".join(f"{n} {k}" for k, n in kinds.most_common())
            + "): "
            + "; ".join(f"{d.request_id}: {d.said}" for d in self.differences[:SHOWN])
            + (f"; ... {len(self.differences) - SHOWN} more" if len(self.differences) > SHOWN else "")
        )


ENGINE_KEYS = ("temperature", "top_p", "top_k", "min_p")


def _engine_settings(records: list[RolloutRecord]) -> dict[str, Any]:
    """The settings the engine applied to the step's requests: each key's one value, or its values said."""
    found: dict[str, Any] = {}
    values: dict[str, set[Any]] = {}
    for r in records:
        for key in ENGINE_KEYS:
            if key in r.sampling:
                values.setdefault(key, set()).add(r.sampling[key])
        values.setdefault("logprobs_mode", set()).add(r.logprobs_mode)
        values.setdefault("dtype", set()).add(r.dtype)
        values.setdefault("engine", set()).add(f"{r.engine} {r.engine_version}".strip())
    for key, seen in values.items():
        seen.discard(None)
        if len(seen) == 1:
            found[key] = next(iter(seen))
        elif seen:
            found[key] = "mixed: " + ", ".join(sorted(map(str, seen)))
    if records:
        found["source"] = f"the engine's record of {len(records)} request(s)"
    return found


def index_records(records: list[RolloutRecord]) -> dict[str, list[RolloutRecord]]:
    by_id: dict[str, list[RolloutRecord]] = {}
    for record in records:
        by_id.setdefault(record.sent_id, []).append(record)
    return by_id


def check_step(batch: TokenBatch, by_id: dict[str, list[RolloutRecord]]) -> StepIdentity:
    """Join one step's requests with the engine's records and compare their ids."""
    identity = StepIdentity(batch.step, batch.samples, 0, 0)
    joined: list[RolloutRecord] = []
    for row, rid in enumerate(batch.request_ids):
        candidates = by_id.get(rid, [])
        if not rid or not candidates:
            continue
        response = tuple(int(t) for t in batch.responses[row][batch.mask[row]])
        prompt = batch.prompt(row)
        trained = tuple(int(t) for t in prompt) if prompt is not None else None
        # a request the engine ran more than once (a retry): the record that matches, else the last
        record = next(
            (c for c in candidates if c.output_ids == response and (trained is None or c.prompt_ids == trained)),
            candidates[-1],
        )
        joined.append(record)
        identity.joined += 1
        if trained is not None:
            identity.prompts_compared += 1
            found = compare_prompt(rid, row, trained, record.prompt_ids)
            if found:
                identity.differences.append(found)
        found = compare_response(rid, row, response, record.output_ids)
        if found:
            identity.differences.append(found)
    identity.engine = _engine_settings(joined)
    return identity


def weights_for_step(step: int | None, training: list[Weights], rollout: list[Weights]) -> WeightCompare | None:
    """The training side's fingerprints against the rollout's for `step`: the rollout file of that step (or of no
    step), against a training file of the same dtype (of that step, or of none)."""

    def pick(files: list[Weights], dtype: str | None = None) -> Weights | None:
        fitting = [w for w in files if dtype is None or w.dtype == dtype]
        return next((w for w in fitting if w.step == step), next((w for w in fitting if w.step is None), None))

    engine = pick(rollout)
    if engine is None:
        return None
    trainer = pick(training, engine.dtype) or pick(training)
    return compare_weights(trainer, engine) if trainer is not None else None


def identity_rows(batch: TokenBatch, identity: StepIdentity | None) -> Any:
    """The capture's mask without the rows whose ids differ: the tokens the numbers may be read on."""
    if identity is None or not identity.differences:
        return batch.mask
    mask = batch.mask.copy()
    mask[sorted(identity.differing_rows)] = False
    return mask


def shown_tensors(names: list[str]) -> str:
    return ", ".join(names[:SHOWN]) + (f", ... {len(names) - SHOWN} more" if len(names) > SHOWN else "")
