"""The report's diagnosis: the causes of a train-vs-rollout gap, ranked, identity first.

First the facts that are not numbers (`identity.py`): a request whose prompt or response ids differ between
the sides (the capture against the rollout engine's own record) is `token-mismatch`, named with the first
differing position, and leaves the numeric diagnosis; weight fingerprints from both sides name stale or
half-synced tensors (`stale-weights`); the dtypes each side computed in (`compute-dtype`: bf16 against fp32,
where both sides recorded theirs and the floor was not measured with the same pair) and the sampling settings
the engine applied come from the engine's record and the capture's provenance. A fact ranks above precision
noise even where the gap is within the floor ("within the floor, but ..."), precision noise then at most half
of it: the gap a float32 trainer makes beside a bfloat16 rollout is smaller than two bfloat16 sides make.

Then the numbers of the remaining tokens (d = log p_train - log p_rollout per token), against a noise floor
measured on two implementations of the same computation (`floor.py`: `--baseline`, the training side against
the rollout engine, the same weights, nothing planted; never the rollout engine against itself alone, never
tighter than the compute dtype resolves), judged on its distribution: the mean, the share of tokens beyond the
floor's 99th percentile, and the sign of d. A step within the floor by all three is `precision-noise` and
nothing but a fact scores there. Out of it, each cause's signature is scored from 0 to 1:

- `logprob-kind`: log-probs at another temperature than the trainer's (raw vs processed): d is a slope in
  log p (T - 1), the settings say the temperatures differ, and the engine's own prefill re-score (raw) agrees
  with the trainer where its decode output does not;
- `sampler-support`: top-p / top-k renormalisation: processed log-probs over the kept tokens, the trainer
  over the whole vocabulary: d = log S_t <= 0, one-signed beyond the floor's tail, the kept mass (verl#6240);
- `broken-layer`: the layer compare's first module out of the layer floor (`layers.py`: msprobe's agreeing pairs
  and the clean steps', module by module), common to every disagreeing pair, is inside the model, the weights
  being the same;
- `stale-weights` without fingerprints: that first module is the model's first (every weight differs), or
  the gap grows from step to step and resets;
- `token-mismatch` without records: requests agree up to a position > 0 and part from there;
- `low-probability-tail`: the gap lives on unlikely tokens, where no cause above explains it;
- `unexplained`: out of the floor, no signature fits.

The verdict follows the same steps (`step_state`): a step whose top cause is precision noise is ok, any other
at least a warning, one whose tokens differ a failure; the two never disagree on a step.
"""

from __future__ import annotations

import itertools
import math
from concurrent.futures import Executor
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from rlprobe_patch.report.capture_format import TokenBatch
from rlprobe_patch.report.confirm import ConsistencySettings, confirm_lines, sampling_of
from rlprobe_patch.report.floor import Floor, FloorReading, dtype_name, read_floor, split_means
from rlprobe_patch.report.identity import StepIdentity, identity_rows, shown_tensors
from rlprobe_patch.report.layers import LayerView, layer_view
from rlprobe_patch.report.metrics import Tokens
from rlprobe_patch.report.verdict import figure as _g

GROWTH = 1.25  # a step's gap above this times the step before's: it grew (not a fluctuation)
SLOPE_SAID = 0.01  # a slope of d in log p below this is not worth a temperature in the evidence
TAIL_P = 0.1  # "low-probability" tokens: rollout p below this
UNEXPLAINED = 0.4  # out of the floor with no cause scoring above it: unexplained ranks first
ONE_SIGNED = 0.9  # the share of a gap's tokens on one side for it to be one-signed
# precision noise's score, at most, where the gap is within the floor but a recorded fact names a cause: issue 41's
# margin (the second cause at most half the first's)
NOISE_BESIDE_FACT = 0.5

TITLES = {
    "token-mismatch": "token or chat-template mismatch: the sides scored other tokens",
    "stale-weights": "stale or half-synced weights (or a stale prefix cache) after a weight update",
    "compute-dtype": "another compute dtype on each side (bf16 against fp32)",
    "logprob-kind": "log-probs at another temperature (raw vs processed)",
    "sampler-support": "top-p / top-k renormalised log-probs (processed over the kept tokens, trainer over all)",
    "broken-layer": "a broken layer",
    "low-probability-tail": "low-probability tail",
    "unexplained": "above the noise floor, no known signature fits",
    "precision-noise": "precision noise only, within the noise floor",
}
STRUCTURAL = ("token-mismatch", "stale-weights", "compute-dtype", "logprob-kind", "sampler-support", "broken-layer")


@dataclass
class Cause:
    cause: str
    score: float  # 0..1: the fit, or 0 where the step's facts rule it out
    fit: float  # 0..1: how well the step's numbers match the signature
    evidence: str
    title: str = ""
    confirm: tuple[str, ...] = ()  # the `script --set` lines that would confirm it

    def __post_init__(self) -> None:
        self.title = self.title or TITLES[self.cause]


# --- what one step brings -------------------------------------------------------------------------------


@dataclass
class Step:
    """One step's evidence: its comparable tokens, what each side says it ran, the layer compare."""

    batch: TokenBatch
    tokens: Tokens  # the rows whose ids are the engine's (or unchecked)
    floor: Floor
    identity: StepIdentity | None = None
    layers: LayerView | None = None
    settings: dict[str, Any] | None = None  # the run's sampling settings (the capture's, else the script's)
    guidance_ok: bool = True  # verl's guidance (where no floor is measured, it must agree for `within`)
    prefill: Any = None  # the engine's re-score of the comparable tokens, where the capture holds it
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def mean(self) -> float:
        # read by most causes: taken once per step
        return self.tokens.memo(
            "mean_abs_dlogp", lambda: float(self.tokens.abs_dlogp.mean()) if self.tokens.size else 0.0
        )

    @property
    def reading(self) -> FloorReading:
        """The comparable tokens against the floor: their mean, tail and sign (`floor.read_floor`)."""
        return read_floor(self.tokens, self.floor)

    @property
    def within(self) -> bool:
        """Within the floor by every test of `reading`, where no request's ids differ (those are no noise); with no
        floor measured, verl's guidance must agree."""
        if self.identity is not None and self.identity.differences:
            return False
        return self.reading.within and (self.floor.measured or self.guidance_ok)

    @property
    def engine(self) -> dict[str, Any]:
        return self.identity.engine if self.identity else {}

    def setting(self, key: str) -> Any:
        """What the engine applied (its record), else what the run's config set."""
        if key in self.engine:
            return self.engine[key]
        return (self.settings or {}).get(key)

    def dtypes(self) -> tuple[str | None, str | None]:
        """(training, rollout) dtypes: the engine's record for the rollout, else the capture's provenance."""
        provenance = self.batch.provenance or {}
        rollout = dtype_name(self.engine.get("dtype")) or dtype_name(provenance.get("rollout_dtype"))
        return dtype_name(provenance.get("training_dtype")), rollout


# --- the signatures --------------------------------------------------------------------------------------


def token_mismatch(step: Step) -> Cause:
    identity = step.identity
    if identity is not None and identity.checked:
        if identity.differences:
            return Cause("token-mismatch", 1.0, 1.0, identity.summary() + ": their numbers are left out")
        return Cause("token-mismatch", 0.0, 0.0, identity.summary())
    onsets, chance = _onsets(step.tokens, step.floor)
    if not onsets:
        return Cause("token-mismatch", 0.0, 0.0, "no request has a token out of the floor (no engine record joined)")
    # a prefix of k tokens within the floor, less the chance of k such tokens in a request that differs throughout
    fit = sum(1.0 - chance**k for k in onsets if k > 0) / len(onsets)
    at = sorted({k for k in onsets if k > 0})
    evidence = (
        f"no engine record joined; {sum(k > 0 for k in onsets)} of {len(onsets)} disagreeing request(s) agree "
        "within the floor up to a position > 0 and part from there"
        + (f" (positions {', '.join(map(str, at[:8]))})" if at else "")
        + f"; a token past its first is back within the floor {chance:.0%} of the time"
    )
    fit, evidence = _unsure(fit, evidence, step.floor)
    depth, where = _divergence_depth(step.layers)
    if depth:
        return Cause("token-mismatch", 0.0, fit, f"{evidence}; but {where}: the inputs agree up to there")
    return Cause("token-mismatch", fit, fit, evidence + "; a token changed on one side leaves the prefix equal")


def stale_weights(step: Step) -> Cause:
    weights = step.identity.weights if step.identity else None
    if weights is not None and weights.comparable and weights.compared:
        if weights.differing:
            n, total = len(weights.differing), weights.compared
            what = "stale weights: every tensor" if n == total else f"half-synced weights: {n} of {total} tensors"
            return Cause(
                "stale-weights",
                1.0,
                1.0,
                f"{what} the engine holds differ from the training side's (by hash, {weights.rollout} against "
                f"{weights.training}): {shown_tensors(weights.differing)}",
            )
        return Cause(
            "stale-weights",
            0.0,
            0.0,
            f"all {weights.compared} tensors the engine holds are the training side's, byte for byte "
            f"({weights.training} against {weights.rollout})",
        )
    share, said = _first_token_share(step.tokens, step.floor)
    if agree := _layers_agree(step.layers):
        return Cause("stale-weights", 0.0, 0.0, f"{said}; but {agree}")
    depth, where = _divergence_depth(step.layers)
    note = f" ({weights.note})" if weights is not None and weights.note else ""
    if depth is None:
        return Cause(
            "stale-weights",
            share / 2,
            share / 2,
            f"{said}; {where}: the layer compare or fingerprints would tell{note}",
        )
    fit = share if depth == 0 else 0.0
    return Cause(
        "stale-weights", fit, fit, f"{said}; {where}" + ("" if depth == 0 else ": one layer, not every weight") + note
    )


def compute_dtype(step: Step) -> Cause:
    training, rollout = step.dtypes()
    if not training or not rollout:
        missing = " and ".join(s for s, d in (("the training side's", training), ("the rollout's", rollout)) if not d)
        return Cause(
            "compute-dtype",
            0.0,
            0.0,
            f"{missing} compute dtype unknown (the capture's provenance, verl.logprob-capture r3; the engine's record)",
        )
    if training == rollout:
        return Cause("compute-dtype", 0.0, 0.0, f"both sides computed in {training}")
    if step.floor.sides == (training, rollout):
        # the floor was measured with the same dtypes: what they do is in the floor, not beside it
        return Cause(
            "compute-dtype",
            0.0,
            1.0,
            f"the training side computed in {training}, the rollout in {rollout}, as in the floor's measurement: "
            "part of the floor",
        )
    d = step.tokens.log_ratio
    said = f"the training side computed in {training}, the rollout in {rollout}"
    if d.size:
        tail = step.tokens.p_rollout < TAIL_P
        low = float(np.abs(d[tail]).mean()) if tail.any() else 0.0
        high = float(np.abs(d[~tail]).mean()) if (~tail).any() else 0.0
        said += f"; mean d {_g(float(d.mean()))}, mean |d| on tokens of p < {TAIL_P} {_g(low)} against {_g(high)} above"
    # the other facts rule out what could look the same: the weights are the trainer's where fingerprints say so
    return Cause("compute-dtype", 1.0, 1.0, said)


def _affine(tokens: Tokens) -> tuple[float, float, float, float]:
    """d ~ slope * log p_rollout + offset: (slope, offset, the share of sum(d^2) explained, the fit less chance)."""
    d, logp = tokens.log_ratio, tokens.rollout
    n, total = d.size, float(np.dot(d, d))
    if n < 3 or total == 0.0:
        return 0.0, 0.0, 0.0, 0.0
    design = np.column_stack([logp, np.ones(n)])
    (slope, offset), *_ = np.linalg.lstsq(design, d, rcond=None)
    residual = d - design @ np.array([slope, offset])
    explained = 1.0 - float(np.dot(residual, residual)) / total
    chance = 2.0 / n  # what two fitted numbers explain of pure noise on n tokens
    return float(slope), float(offset), explained, max(0.0, (explained - chance) / (1.0 - chance))


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None  # an interpolation the reader left unresolved, a "mixed: ..." value, or no number


def _engine_split(step: Step) -> tuple[bool, str]:
    """Whether the engine's own prefill re-score agrees with the trainer where its decode output does not: the
    two implementations agree, the engine's decode log-probs are of another kind (or another computation)."""
    split = split_means(step.tokens, step.prefill)
    if split is None:
        return False, ""
    agree = split["trainer_vs_prefill"] <= step.floor.mean_limit < split["prefill_vs_decode"]
    said = (
        f"the engine's prefill re-score against the trainer: mean |d| {_g(split['trainer_vs_prefill'])}; against its "
        f"own decode output: {_g(split['prefill_vs_decode'])}"
    )
    return agree, said + (": the two implementations agree, the decode output's log-probs differ" if agree else "")


def logprob_kind(step: Step) -> Cause:
    slope, offset, explained, fit = _affine(step.tokens)
    if not step.tokens.size:
        return Cause("logprob-kind", 0.0, 0.0, "no comparable token")
    evidence = (
        f"d = log p_train - log p_rollout ~ {_g(slope)} * log p_rollout {'-' if offset < 0 else '+'} "
        f"{_g(abs(offset))} explains {explained:.0%} of sum(d^2) on {step.tokens.size} tokens: a constant offset "
        f"{_g(offset)} = log {_g(math.exp(offset))}"
    )
    if abs(slope) >= SLOPE_SAID and slope > -1.0:
        # within one context log p_1 = T log p_T + const: d = (T - 1) log p_T + const with the rollout's at T and the
        # trainer's at 1, or d = (1/T - 1) log p_1 + const with the trainer's at T and the rollout's raw
        evidence += (
            f", and a slope {_g(slope)}: as if the rollout's log-probs were at temperature {_g(1.0 + slope)} and the "
            f"trainer's at 1, or the trainer's at {_g(1.0 / (1.0 + slope))} and the rollout's raw"
        )
    engine_split, split_said = _engine_split(step)
    temperature, mode = _number(step.setting("temperature")), step.setting("logprobs_mode")
    trained = _number((step.batch.provenance or {}).get("training_temperature"))
    source = step.engine.get("source") or (step.settings or {}).get("source") or "the run's settings"
    if temperature is None or mode is None:
        # a gap the settings could explain but do not say: three quarters of the fit (above the half a first-token
        # share of the weights' causes gets without a layer compare: an affine gap is no weight's scatter)
        fit, said = (0.75 * fit, "the rollout's temperature or log-probs mode is unknown (three quarters of the fit)")
    else:
        # the temperature the rollout's log-probs are at, and the trainer's (the run's temperature: verl scores at it)
        rollout_t = temperature if str(mode).startswith("processed") else 1.0
        trainer_t = trained if trained is not None else temperature
        said = f"{source}: temperature {_g(temperature)}, {mode}; the trainer scores at {_g(trainer_t)}"
        if rollout_t == trainer_t:
            fit, said = fit / 4, said + ": the same temperature on both sides rules it out (a quarter of the fit)"
        else:
            expected = rollout_t / trainer_t - 1.0
            agrees = slope * expected > 0
            if agrees:
                fit = max(fit, 0.9 if engine_split or not split_said else 0.75)
            said += (
                f": log-probs at temperature {_g(rollout_t)} against {_g(trainer_t)}, a slope of {_g(expected)} "
                + ("expected and found" if agrees else f"expected, {_g(slope)} found")
            )
    parts = [evidence, said] + ([split_said] if split_said else [])
    return Cause("logprob-kind", fit, fit, "; ".join(parts))


def sampler_support(step: Step) -> Cause:
    d = step.tokens.log_ratio
    if not d.size:
        return Cause("sampler-support", 0.0, 0.0, "no comparable token")
    # beyond the floor's own tail (its 99th percentile, where measured): top-p 0.8 moves a token by at most -log 0.8,
    # within a bfloat16 floor's token limit
    measured = step.floor.tail_limit is not None
    out = np.abs(d) > (step.floor.tail_limit if measured else step.floor.token_limit)
    beyond = "the floor's 99th percentile" if measured else "the fixed gate"
    below = int((d[out] < 0).sum())
    moved = int(out.sum())
    share = below / moved if moved else 0.0
    # one-signed: each token's rollout log-prob above the trainer's by -log S_t, the kept mass
    fit = max(0.0, (share - 0.5) / (ONE_SIGNED - 0.5)) if moved else 0.0
    fit = min(fit, 1.0)
    kept = int((step.tokens.rollout[out] >= -1e-6).sum())  # p = 1 after renormalisation: the only token kept
    evidence = (
        f"{below} of {moved} token(s) beyond {beyond} have the rollout's log-prob above the trainer's (d < 0: "
        f"{share:.0%}; renormalised over a kept set, every one does, by -log of the kept mass)"
        + (f"; {kept} of them have rollout p = 1 (the only token kept)" if kept else "")
    )
    top_p, top_k, mode = _number(step.setting("top_p")), _number(step.setting("top_k")), step.setting("logprobs_mode")
    source = step.engine.get("source") or (step.settings or {}).get("source") or "the run's settings"
    if top_p is None or mode is None:
        fit, said = fit / 2, "the rollout's top_p / top_k or log-probs mode unknown (half the fit)"
    else:
        truncating = top_p < 1.0 or (top_k is not None and top_k > 0)
        said = f"{source}: top_p {_g(top_p)}, top_k {top_k if top_k is not None else 'unset'}, {mode}"
        if not truncating or not str(mode).startswith("processed"):
            fit, said = fit / 4, said + ": nothing renormalised (a quarter of the fit)"
        elif share >= ONE_SIGNED:
            fit, said = max(fit, 0.95), said + ": the processed log-probs are over the kept tokens only"
    _, split_said = _engine_split(step)
    return Cause("sampler-support", fit, fit, "; ".join([evidence, said] + ([split_said] if split_said else [])))


def broken_layer(step: Step) -> Cause:
    share, said = _first_token_share(step.tokens, step.floor)
    weights = step.identity.weights if step.identity else None
    if weights is not None and weights.comparable and weights.differing:
        return Cause("broken-layer", 0.0, 0.0, f"{said}; but the weights differ: stale-weights, not a layer")
    if agree := _layers_agree(step.layers):
        return Cause("broken-layer", 0.0, 0.0, f"{said}; but {agree}")
    depth, where = _divergence_depth(step.layers)
    if depth is None:
        # the tokens alone cannot tell one layer from every weight: half the fit, and the layer compare to ask
        return Cause("broken-layer", share / 2, share / 2, f"{said}; {where}: the layer compare would tell")
    fit = 1.0 if depth > 0 else 0.0
    same = (
        f"; the weights are the training side's ({weights.compared} tensors by hash)"
        if weights is not None and weights.comparable
        else ""
    )
    return Cause(
        "broken-layer", fit, fit, f"{where}; {said}" + ("" if depth else ": the first module, not one layer") + same
    )


def low_probability_tail(tokens: Tokens) -> Cause:
    tail = tokens.p_rollout < TAIL_P
    token_share = float(tail.mean()) if tokens.size else 0.0
    total = float(tokens.abs_dlogp.sum())
    if total == 0.0 or token_share >= 1.0:
        why = "no difference" if total == 0.0 else f"every token has p < {TAIL_P}: no tail to tell apart"
        return Cause("low-probability-tail", 0.0, 0.0, why)
    share = float(tokens.abs_dlogp[tail].sum()) / total
    fit = max(0.0, (share - token_share) / (1.0 - token_share))
    # sum |dlogp| per third of the responses, in the tail and out of it: one count of the six (third, tail) groups
    sums = np.bincount(2 * _third(tokens) + tail, weights=tokens.abs_dlogp, minlength=6)
    thirds = [_g(float(sums[2 * k + 1] / max(sums[2 * k] + sums[2 * k + 1], 1e-300))) for k in range(3)]
    evidence = (
        f"tokens of p < {TAIL_P} hold {share:.0%} of sum |dlogp| and are {token_share:.0%} of the tokens; their share "
        f"by position (first, middle, last third of the responses): {', '.join(thirds)}"
    )
    return Cause("low-probability-tail", fit, fit, evidence)


def _third(tokens: Tokens) -> Any:
    """Each token's third of its response (0, 1, 2)."""
    length = np.maximum(tokens.counts[tokens.row], 1)
    # min(3 * position // length, 2), by two comparisons (an integer division per token cost more than the rest)
    three = 3 * tokens.position
    third = (three >= length).astype(np.intp)
    third += three >= 2 * length
    return third


def precision_noise(step: Step) -> Cause:
    """Within the floor by every test: the gap is noise (1); `diagnose_step` keeps half of that where a recorded
    fact names a cause all the same."""
    floor = step.floor
    evidence = step.reading.said()
    if not floor.measured and not step.guidance_ok and step.reading.within:
        evidence += ", but verl's guidance grades the step above its warning level"
    if step.identity is not None and step.identity.differences:
        evidence += f"; but {len(step.identity.differing_rows)} request(s) scored other tokens on each side: no noise"
    return Cause("precision-noise", 1.0 if step.within else 0.0, 1.0 if step.within else 0.0, evidence)


# --- helpers of the signatures ----------------------------------------------------------------------------


def _onsets(tokens: Tokens, floor: Floor) -> tuple[list[int], float]:
    """Per request with a token out of the floor, its first such position; and how often a token from there on
    is back within the floor (the chance that a prefix token looks clean although the request has parted).
    Found once per step (several causes read them)."""
    return tokens.memo(("onsets", floor.token_limit), lambda: _find_onsets(tokens, floor))


def _find_onsets(tokens: Tokens, floor: Floor) -> tuple[list[int], float]:
    out = np.flatnonzero(tokens.abs_dlogp > floor.token_limit)
    rows = tokens.row[out]  # in row order: a row's first token out is where its row number changes
    first = np.flatnonzero(np.concatenate([[True], rows[1:] != rows[:-1]])) if out.size else out
    rows = rows[first]
    onsets = tokens.position[out[first]]
    after = int((tokens.counts[rows] - onsets).sum())  # the tokens from each onset to its row's end
    back = after - out.size  # of them, those within the floor
    return onsets.tolist(), back / after if after else 0.0


def _first_token_share(tokens: Tokens, floor: Floor) -> tuple[float, str]:
    onsets, _ = _onsets(tokens, floor)
    if not onsets:
        return 0.0, "no request has a token out of the floor"
    first = onsets.count(0)
    share, said = first / len(onsets), f"{first} of {len(onsets)} disagreeing request(s) differ from the first token"
    return _unsure(share, said, floor)


def _unsure(fit: float, evidence: str, floor: Floor) -> tuple[float, str]:
    """Where a token is in or out of the floor matters and the floor is the fixed gate: half the fit, said why."""
    if floor.measured:
        return fit, evidence
    return fit / 2, evidence + " (half the fit: with no floor measured, a token within the fixed gate may be chance)"


def _divergence_depth(view: LayerView | None) -> tuple[int | None, str]:
    """Where the first module out of the floor in every disagreeing pair sits in the forward order (0: the first)."""
    if view is None or not view.disagreeing:
        return None, "no layer compare with a disagreeing pair"
    if view.depth is None:
        return None, f"{len(view.disagreeing)} disagreeing pair(s), no first module {view.how} in common"
    return view.depth, (
        f"the first module {view.how} in every one of {len(view.disagreeing)} disagreeing pair(s) is "
        f"{view.first_common} (module {view.depth + 1} of {view.modules})"
    )


def _layers_agree(view: LayerView | None) -> str:
    """What the layer compare says when every pair is within its floor ("" when it does not)."""
    if view is None or not view.agree:
        return ""
    noise = f" ({len(view.within_floor)} flagged by msprobe within the layer floor)" if view.within_floor else ""
    return (
        f"the layer compare agrees in all {view.pairs} pair(s){noise}: the weights and the forward are the same "
        "on both sides"
    )


# --- ranking ---------------------------------------------------------------------------------------------


def _ranked(causes: list[Cause]) -> list[Cause]:
    order = list(TITLES)
    return sorted(causes, key=lambda c: (-c.score, order.index(c.cause)))


def diagnose_step(step: Step) -> list[Cause]:
    """The step's causes, ranked: the facts (ids, weights, dtypes as both sides recorded them) whatever the numbers,
    above precision noise even within the floor; the numbers' signatures only out of the floor; the tail only where
    no structural cause explains the gap; unexplained where none fits."""
    facts = [token_mismatch(step), stale_weights(step), compute_dtype(step)]
    numeric = [logprob_kind(step), sampler_support(step), broken_layer(step)]
    tail = low_probability_tail(step.tokens)
    noise = precision_noise(step)
    if step.within:
        for c in numeric + [tail]:
            c.score = 0.0
        # within the floor, the numeric readings of the facts (the prefix heuristic, a layer compare) say nothing
        for c in facts:
            if not _is_fact(c, step):
                c.score = 0.0
        if named := [c for c in facts if c.score > 0]:
            # direct evidence wins without a tie: the gap is as small as noise, but the records name a cause
            for c in named:
                c.evidence = f"within the floor, but {c.evidence}"
            noise.score = noise.fit = min(noise.score, NOISE_BESIDE_FACT * max(c.score for c in named))
            noise.evidence += f"; but both sides' records name {', '.join(c.cause for c in named)}"
    else:
        best = max(c.score for c in facts + numeric)
        tail.score = tail.fit * (1.0 - best)
    causes = facts + numeric + [tail]
    top = max(c.score for c in causes)
    unexplained = Cause(
        "unexplained",
        UNEXPLAINED if not step.within and top < UNEXPLAINED else 0.0,
        0.0,
        f"out of the floor by its {' and '.join(step.reading.leaving) or 'ids'} and no signature scores "
        f"{UNEXPLAINED:g} or more"
        if not step.within
        else "within the floor",
    )
    return _ranked([*causes, unexplained, noise])


def _is_fact(cause: Cause, step: Step) -> bool:
    """Whether a cause's score comes from what both sides recorded (ids, weight hashes, compute dtypes), not from
    the numbers."""
    identity = step.identity
    if cause.cause == "token-mismatch":
        return identity is not None and identity.checked
    if cause.cause == "stale-weights":
        weights = identity.weights if identity else None
        return weights is not None and weights.comparable and weights.compared > 0
    if cause.cause == "compute-dtype":
        return all(step.dtypes())
    return False


def step_state(top: str, step: Step, guidance_state: str) -> str:
    """The verdict of a step, from its diagnosis: the tokens differ: fail; within the floor: ok; out of it: verl's
    guidance, at least a warning."""
    if top == "token-mismatch" and step.identity is not None and step.identity.differences:
        return "fail"
    if top == "precision-noise":
        return "ok"
    return "fail" if guidance_state == "fail" else "warn"


def growth_and_reset(means: list[float], floor: Floor) -> Cause:
    """Over the steps in order: the gap growing from step to step (and falling back), as a stale cache leaves it."""
    if len(means) < 3:
        return Cause("stale-weights", 0.0, 0.0, f"{len(means)} step(s): too few to see a trend")
    rises = sum(b > GROWTH * a and b > floor.mean_limit for a, b in itertools.pairwise(means))
    resets = sum(b < a / 2 for a, b in itertools.pairwise(means))
    fit = rises / (len(means) - 1 - resets) if len(means) - 1 > resets else 0.0
    series = ", ".join(_g(m) for m in means[:12]) + (" ..." if len(means) > 12 else "")
    return Cause(
        "stale-weights",
        fit,
        fit,
        f"mean |dlogp| by step {series}: {rises} rise(s) by {GROWTH:g}x or more out of the floor, "
        f"{resets} reset(s) (a fall by half or more)",
    )


def clip_shares(tokens: Tokens, clip: tuple[float, float]) -> dict[str, float]:
    """The share of tokens whose ratio p_train / p_rollout leaves PPO's clip range [1 - low, 1 + high]: what the
    gap alone would clip at step 0 where the rollout's log-probs are the old policy's (bypass mode; the
    "phantom clipping" of a bf16 rollout against an fp32 trainer)."""
    low, high = clip
    d = tokens.log_ratio
    if not d.size:
        return {"above": 0.0, "below": 0.0, "total": 0.0}
    above = float((d > math.log1p(high)).mean())
    below = float((d < math.log1p(-low)).mean()) if low < 1.0 else 0.0
    return {"above": above, "below": below, "total": above + below}


@dataclass(frozen=True)
class Judged:
    """One step judged: its entry of the diagnosis document, its causes ranked, and what the run's reading takes from
    it."""

    entry: dict[str, Any]
    causes: list[Cause]
    step: int | None  # the batch's step
    mean: float
    within: bool


def judge_step(
    step: Step,
    index: int,
    guidance: dict[int, str] | None,
    clip: tuple[float, float] | None,
    layers: dict[str, Any] | None = None,
    clean: set[str] | None = None,
) -> Judged:
    """Batch `index`'s step judged on its own (`layers`: the run's layer compare, read for this step's requests, the
    `clean` ones its floor)."""
    step.layers = layer_view(layers, set(step.batch.request_ids), clean)
    entry, causes = _judged_entry(index, step, diagnose_step(step), guidance, clip)
    return Judged(entry, causes, step.batch.step, step.mean, step.within)


def in_step_order(judged: dict[int, Judged]) -> list[Judged]:
    """The steps judged (by their batch's index) in the order of their step numbers (the batches' order for ties)."""
    return [judged[i] for i in sorted(judged, key=lambda i: (judged[i].step is None, judged[i].step or 0, i))]


def diagnose(
    batches: list[TokenBatch],
    layers: dict[str, Any] | None,
    floor: Floor,
    script: str | None = None,
    sampling: dict[str, Any] | None = None,
    identities: dict[int, StepIdentity] | None = None,
    guidance: dict[int, str] | None = None,
    clip: tuple[float, float] | None = None,
    parts: list[Tokens] | None = None,
    *,
    consistency: ConsistencySettings | None = None,
    clip_source: str | None = None,
    pool: Executor | None = None,
) -> dict[str, Any]:
    """The diagnosis document: the floor, each step's causes ranked, and the run's (each cause's best step).

    `sampling` is the run's rollout settings (`run_settings`), where its launch script was read: a step whose
    capture recorded its own (`TokenBatch.sampling`) is judged against those, and the engine's record beats
    both. `identities` (by the batch's index) hold each step's identity check; `guidance` each step's state by
    verl's guidance (it must agree with `within` where no floor is measured); `clip` the run's PPO clip range (read
    from `clip_source`). `consistency`: what a consistency script of `script` sets (`confirm.confirm_lines`).
    `parts`: each batch's valid tokens as the report took them out (`build.step_tokens`), in the order of
    `batches`, read where no row is left out (else taken out here). `pool`: threads to judge the steps in. A step's
    per-token values are freed once it is judged (`Tokens.forget`).

    The report without a layer compare judges each step as it takes its figures (`make_step`, `judge_step`) and
    reads the run from them (`conclude`): this is the same, the steps first."""
    made = (
        make_step(b, i, floor, sampling, identities, guidance, parts[i] if parts else None)
        for i, b in enumerate(batches)
    )
    steps = {i: step for i, step in enumerate(made) if step is not None}
    # the layer floor: msprobe's agreeing pairs and the clean steps' (in bfloat16 msprobe's thresholds fail them all)
    clean = _clean_requests(list(steps.values())) if layers else set()

    def judge(index: int) -> Judged:
        judged = judge_step(steps[index], index, guidance, clip, layers, clean)
        steps[index].tokens.forget()  # its figures are kept (`memo`), its per-token values freed for the next step's
        return judged

    # each step judged on its own (in `pool`'s threads where given: numpy's loops release the interpreter's lock)
    indices = list(steps)
    judged = dict(zip(indices, (pool.map if pool else map)(judge, indices)))
    return conclude(
        in_step_order(judged),
        floor,
        layer_view(layers, None, clean),  # the run's, of every pair; each step read its own requests' pairs
        script,
        sampling,
        clip,
        consistency=consistency,
        clip_source=clip_source,
    )


def conclude(
    judged: list[Judged],
    floor: Floor,
    view: LayerView | None,
    script: str | None = None,
    sampling: dict[str, Any] | None = None,
    clip: tuple[float, float] | None = None,
    *,
    consistency: ConsistencySettings | None = None,
    clip_source: str | None = None,
) -> dict[str, Any]:
    """The diagnosis document of the steps `judged` (in step order; `in_step_order`): each cause's best step, the
    trend over the steps, the run's noise, ranked, each with the runs that would confirm it."""
    best: dict[str, Cause] = {}
    best_key: dict[str, tuple[float, bool, float]] = {}
    for step in judged:
        for c in step.causes:
            # the step that shows the cause best: by score, then a step out of the floor (a clean step's reading of
            # a cause is no evidence of it), then by fit
            key = (c.score, not step.within, c.fit)
            if c.cause not in best or key > best_key[c.cause]:
                best[c.cause] = Cause(c.cause, c.score, c.fit, f"step {step.step}: {c.evidence}")
                best_key[c.cause] = key
    trend = growth_and_reset([step.mean for step in judged], floor)
    if "stale-weights" in best and trend.score > best["stale-weights"].score:
        best["stale-weights"] = trend
    steps = [step.entry for step in judged]
    if steps:
        # noise is the run's verdict only as far as every step is noise: the least noise-like step's score
        worst = min(steps, key=lambda s: (_noise(s)["score"], -s["mean_abs_dlogp"]))
        noise = _noise(worst)
        best["precision-noise"] = Cause(
            "precision-noise", noise["score"], noise["fit"], f"step {worst['step']}: {noise['evidence']}"
        )
        if all(s["within_floor"] for s in steps):
            best["unexplained"] = Cause("unexplained", 0.0, 0.0, "every step within the floor")
    ranked = _ranked(list(best.values()))
    for c in ranked:
        c.confirm = confirm_lines(c.cause, script, consistency, sampling_of(steps, c.cause))
    return {
        "floor": asdict(floor),
        "layers": asdict(view) if view is not None else None,
        "sampling": sampling,
        "clip": _clip_json(clip, clip_source),
        "causes": [_plain(c) for c in ranked],
        "top": ranked[0].cause if ranked else None,
        "steps": steps,
    }


def _judged_entry(
    index: int, step: Step, causes: list[Cause], guidance: dict[int, str] | None, clip: tuple[float, float] | None
) -> tuple[dict[str, Any], list[Cause]]:
    """A step's entry of the diagnosis document, and its causes ranked."""
    b = step.batch
    state = step_state(causes[0].cause, step, (guidance or {}).get(index, "ok"))
    entry: dict[str, Any] = {
        "batch": index,  # the input's index: the verdict's grade of the same step
        "step": b.step,
        "kind": b.kind,
        "mean_abs_dlogp": step.mean,
        "within_floor": step.within,
        "leaves_floor_by": step.reading.leaving,
        "state": state,
        "tokens": step.tokens.size,
        "sampling": step.settings,
        "engine": step.engine or None,
        "identity": _identity_json(step.identity),
        "split": split_means(step.tokens, step.prefill),
        "causes": [_plain(c) for c in causes],
    }
    if clip is not None:
        entry["clip"] = {"low": clip[0], "high": clip[1], **clip_shares(step.tokens, clip)}
    return entry, causes


def make_step(
    b: TokenBatch,
    index: int,
    floor: Floor,
    sampling: dict[str, Any] | None,
    identities: dict[int, StepIdentity] | None,
    guidance: dict[int, str] | None,
    tokens: Tokens | None = None,
) -> Step | None:
    """Batch `index`'s evidence as a step (its layer view comes once the clean steps are known), or None where it has
    nothing to judge. `tokens`: the batch's valid tokens where taken out already (read where no row is left out)."""
    identity = (identities or {}).get(index)
    mask = identity_rows(b, identity)
    if tokens is None or mask is not b.mask:
        tokens = Tokens.of(b.rollout, b.training, mask)
    if not tokens.size and not (identity and identity.differences):
        return None
    return Step(
        batch=b,
        tokens=tokens,
        floor=floor,
        identity=identity,
        settings={"source": f"step {b.step}'s capture", **b.sampling} if b.sampling is not None else sampling,
        guidance_ok=(guidance or {}).get(index, "ok") in ("ok", "no value"),
        prefill=b.prefill[mask] if b.prefill is not None else None,
    )


def _is_clean(step: Step) -> bool:
    """A step whose layer compare can be the layer floor: within a measured token floor, its ids the engine's, and
    no weight or compute dtype recorded different on the two sides."""
    if not (step.floor.measured and step.within):
        return False
    weights = step.identity.weights if step.identity else None
    training, rollout = step.dtypes()
    stale = weights is not None and weights.comparable and bool(weights.differing)
    return not stale and not (training and rollout and training != rollout)


def _clean_requests(steps: list[Step]) -> set[str]:
    """The request ids whose layer compare pairs are the clean steps': a clean step's ids, less those a step that is
    not clean shares with another rollout of them (an engine that numbers its requests from 0 each session: the pair
    could be either run's). A step that scored other tokens of the same rollout (the template, a changed token: the
    engine's log-probs the same) leaves the id the clean step's."""
    rollouts: dict[str, list[bytes]] = {}
    for step in steps:
        for row, request in enumerate(step.batch.request_ids):
            rollouts.setdefault(request, []).append(step.batch.rollout[row][step.batch.mask[row]].tobytes())
    clean = {r for step in steps if _is_clean(step) for r in step.batch.request_ids}
    return {r for r in clean if len(set(rollouts[r])) == 1}


def _noise(entry: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in entry["causes"] if c["cause"] == "precision-noise")


def _clip_json(clip: tuple[float, float] | None, source: str | None) -> dict[str, Any] | None:
    if clip is None:
        return None
    return {"low": clip[0], "high": clip[1], **({"source": source} if source is not None else {})}


def _identity_json(identity: StepIdentity | None) -> dict[str, Any] | None:
    if identity is None:
        return None
    return {
        "requests": identity.requests,
        "joined": identity.joined,
        "prompts_compared": identity.prompts_compared,
        "differences": [asdict(d) for d in identity.differences],
        "summary": identity.summary(),
        "weights": asdict(identity.weights) if identity.weights is not None else None,
    }


def _plain(cause: Cause) -> dict[str, Any]:
    return asdict(cause) | {"confirm": list(cause.confirm)}
