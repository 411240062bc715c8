"""The report's diagnosis: the causes of a train-vs-rollout gap, ranked by how well each one's signature fits.

Each cause is a signature over one step's tokens (d = log p_train - log p_rollout per token) and the
layer compare, scored from 0 (no sign of it) to 1 (the pattern it leaves, fully); the causes and their
signatures come from `docs/report.md` ("Diagnosis") and the survey behind it (vLLM's `logprobs_mode`,
Miles's symptom table, "Taming the Tail", TIS):

- `logprob-kind`: the rollout's log-probs of another kind than the trainer's (raw where the trainer applies
  temperature / top-k / top-p): d is systematic, a constant offset (about log T) or a slope in log p
  (1/T - 1), not scatter. The fit: the share of sum(d^2) an affine fit d ~ a * log p_rollout + b explains,
  less what it would explain of pure noise (2 of n tokens).
- `token-mismatch`: a response token (or the template) differs between the sides from some position on:
  a request agrees within the noise floor up to a position > 0 and not from there. The fit: the share of
  the disagreeing requests with such a clean prefix.
- `stale-weights`: the rollout runs weights (or a prefix cache) of an earlier update: every token differs
  from the first; the layer compare's first common divergence is the model's first module (every weight
  differs); over the steps the gap grows and resets.
- `broken-layer`: one layer differs: every token differs from the first, and the layer compare's first
  module out of msprobe's thresholds, common to every disagreeing pair, is inside the model.
- `low-probability-tail`: the gap lives on unlikely tokens: the share of sum |d| from tokens of p < 0.1
  above their share of the tokens (0 when every token is that unlikely: nothing to tell apart).
- `precision-noise`: within the noise floor: bf16 or kernel rounding, not a bug.

The noise floor is measured, not fixed: on a baseline capture (`--baseline`: the same engine run twice on
the same batch, or batch 1 against batched) or on a step of the inputs known to run the same weights on
both sides (`--floor-step`: the demo's step 1). A step leaves it when its mean |d| is above `FLOOR_FACTOR`
times the floor's, a token when its |d| is above `FLOOR_FACTOR` times the floor's 99th percentile (each at
least the float32 rounding of the log-probs). Without a measurement, NeMo-RL's fixed gate stands in, and
the diagnosis says so. A cause other than `precision-noise` scores 0 on a step within the floor.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from rlprobe_patch.errors import RefusedError
from rlprobe_patch.report.capture_format import TokenBatch
from rlprobe_patch.report.confirm import confirm_lines, sampling_of
from rlprobe_patch.report.metrics import Tokens, quantiles
from rlprobe_patch.report.verdict import TME_GATE, TME_SOURCE

FLOOR_FACTOR = 4.0  # how far above the floor's spread a step or a token must be to leave it
GROWTH = 1.25  # a step's gap above this times the step before's: it grew (not a fluctuation)
SLOPE_SAID = 0.01  # a slope of d in log p below this is not worth a temperature in the evidence
TAIL_P = 0.1  # "low-probability" tokens: rollout p below this
FLOAT32_ULPS = 2.0  # the float32 rounding of a log-prob (the capture's dtype), in units in the last place

TITLES = {
    "logprob-kind": "log-probs of the wrong kind (raw vs processed: temperature / top-k / top-p)",
    "token-mismatch": "token or chat-template mismatch",
    "stale-weights": "stale weights or prefix cache after a weight update",
    "broken-layer": "a broken layer",
    "low-probability-tail": "low-probability tail",
    "precision-noise": "precision noise only (bf16 / kernel), within the noise floor",
}


@dataclass(frozen=True)
class Floor:
    """The spread that is not a bug, and the limits derived from it."""

    measured: bool
    how: str  # how it was measured, or that it was not
    mean_limit: float  # a step's mean |d| above it leaves the floor
    token_limit: float  # a token's |d| above it leaves the floor
    tokens: int = 0
    mean_abs_dlogp: float | None = None
    p99_abs_dlogp: float | None = None
    max_abs_dlogp: float | None = None


@dataclass
class Cause:
    cause: str
    score: float  # 0..1: the fit, or 0 on a step within the floor
    fit: float  # 0..1: how well the step's numbers match the signature
    evidence: str
    title: str = ""
    confirm: tuple[str, ...] = ()  # the `script --set` lines that would confirm it

    def __post_init__(self) -> None:
        self.title = self.title or TITLES[self.cause]


def _g(value: float) -> str:
    return f"{value:.3g}"


def measure_floor(batches: list[TokenBatch], how: str) -> Floor:
    """The floor from `batches`, two computations of the same tokens that should agree (`how` says which)."""
    tokens = Tokens.join([(b.rollout, b.training, b.mask, None) for b in batches])
    if not tokens.size:
        return no_floor(f"{how} has no response token: no floor measured")
    d = tokens.abs_dlogp
    # the log-probs are float32 in a capture: below a few units in the last place nothing can be told apart
    resolution = FLOAT32_ULPS * float(np.spacing(np.float32(np.abs(tokens.rollout).max())))
    mean, (p99,) = float(d.mean()), quantiles(d, (0.99,))
    return Floor(
        measured=True,
        how=f"{how}: {tokens.size} tokens, mean |dlogp| {_g(mean)}, 99th percentile {_g(p99)}; a step leaves it "
        f"above {FLOOR_FACTOR:g}x the mean, a token above {FLOOR_FACTOR:g}x the 99th percentile (each at least "
        f"{FLOAT32_ULPS:g} float32 ulps, {_g(resolution)})",
        mean_limit=FLOOR_FACTOR * max(mean, resolution),
        token_limit=FLOOR_FACTOR * max(p99, resolution),
        tokens=tokens.size,
        mean_abs_dlogp=mean,
        p99_abs_dlogp=p99,
        max_abs_dlogp=float(d.max()),
    )


def no_floor(why: str) -> Floor:
    """NeMo-RL's fixed gate in place of a measured floor: mean exp(|d|) 1.05, so |d| about log 1.05."""
    gate = math.log(TME_GATE)
    return Floor(
        measured=False,
        how=f"{why}; the fixed gate stands in: mean exp(|dlogp|) {TME_GATE} ({TME_SOURCE}), |dlogp| {_g(gate)} "
        "(give --baseline CAPTURE, the same engine run twice on one batch, or --floor-step N, a step run with the "
        "same weights on both sides, to measure it)",
        mean_limit=gate,
        token_limit=gate,
    )


# --- the signatures, one step each ---------------------------------------------------------------------


def logprob_kind(tokens: Tokens, sampling: dict[str, Any] | None = None) -> Cause:
    d, logp = tokens.log_ratio, tokens.rollout
    n, total = d.size, float(np.dot(d, d))
    if n < 3 or total == 0.0:
        return Cause("logprob-kind", 0.0, 0.0, "too few tokens, or no difference, to fit")
    design = np.column_stack([logp, np.ones(n)])
    (slope, offset), *_ = np.linalg.lstsq(design, d, rcond=None)
    residual = d - design @ np.array([slope, offset])
    explained = 1.0 - float(np.dot(residual, residual)) / total
    chance = 2.0 / n  # what two fitted numbers explain of pure noise on n tokens
    fit = max(0.0, (explained - chance) / (1.0 - chance))
    evidence = (
        f"d = log p_train - log p_rollout ~ {_g(slope)} * log p_rollout {'-' if offset < 0 else '+'} {_g(abs(offset))} "
        f"explains {explained:.0%} of "
        f"sum(d^2) on {n} tokens ({chance:.0%} for noise): a constant offset {_g(offset)} = log {_g(math.exp(offset))}"
    )
    if abs(slope) >= SLOPE_SAID and slope > -1.0:
        # within one context log p_1 = T log p_T + const: d = (T - 1) log p_T + const with the rollout's at T and the
        # trainer's at 1, or d = (1/T - 1) log p_1 + const with the trainer's at T and the rollout's raw
        evidence += (
            f", and a slope {_g(slope)}: as if the rollout's log-probs were at temperature {_g(1.0 + slope)} and the "
            f"trainer's at 1, or the trainer's at {_g(1.0 / (1.0 + slope))} and the rollout's raw"
        )
    fit, said = _against_sampling(fit, sampling)
    return Cause("logprob-kind", fit, fit, f"{evidence}; {said}")


# the values at which each logit processor is off; an unset key counts as off (verl's default in every tested release)
SAMPLING_UNSET = {"temperature": 1.0, "top_p": 1.0, "top_k": -1}


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None  # an interpolation the reader left unresolved, or no number


def _against_sampling(fit: float, sampling: dict[str, Any] | None) -> tuple[float, str]:
    """The fit against the run's own settings: at T = 1 without top-k / top-p raw and processed log-probs are the
    same (half the fit); raw log-probs with a processor on are the cause by configuration (at least half)."""
    if sampling is None:
        return fit, "the run's sampling settings are unknown (--replay-script RUN.sh reads them)"
    shown = ", ".join(f"{k} {v}" for k, v in sampling.items() if k != "source")
    said = f"{sampling['source']} sets {shown or 'none of temperature, top_p, top_k, logprobs_mode'}"
    temperature, top_p, top_k = (_number(sampling.get(k, unset)) for k, unset in SAMPLING_UNSET.items())
    if temperature is None or top_p is None or top_k is None:
        return fit, f"{said} (not all as numbers: not judged)"
    if temperature == 1.0 and top_p >= 1.0 and top_k <= 0:
        return (
            fit / 2,
            f"{said}: at T = 1 without top-k / top-p, raw and processed log-probs are the same (half the fit)",
        )
    if sampling.get("logprobs_mode") == "raw_logprobs":
        return max(fit, 0.5), f"{said}: raw log-probs while a logit processor is on (at least half the fit)"
    return fit, said


def _onsets(tokens: Tokens, floor: Floor) -> tuple[list[int], float]:
    """Per request with a token out of the floor, its first such position; and how often a token from there on
    is back within the floor (the chance that a prefix token looks clean although the request has parted)."""
    out = np.flatnonzero(tokens.abs_dlogp > floor.token_limit)
    rows = tokens.row[out]  # in row order: a row's first token out is where its row number changes
    first = np.flatnonzero(np.concatenate([[True], rows[1:] != rows[:-1]])) if out.size else out
    rows = rows[first]
    onsets = tokens.position[out[first]]
    after = int((tokens.counts[rows] - onsets).sum())  # the tokens from each onset to its row's end
    back = after - out.size  # of them, those within the floor
    return onsets.tolist(), back / after if after else 0.0


def token_mismatch(tokens: Tokens, floor: Floor, layers: dict[str, Any] | None) -> Cause:
    onsets, chance = _onsets(tokens, floor)
    if not onsets:
        return Cause("token-mismatch", 0.0, 0.0, "no request has a token out of the floor")
    # a prefix of k tokens within the floor, less the chance of k such tokens in a request that differs throughout
    fit = sum(1.0 - chance**k for k in onsets if k > 0) / len(onsets)
    at = sorted({k for k in onsets if k > 0})
    evidence = (
        f"{sum(k > 0 for k in onsets)} of {len(onsets)} disagreeing request(s) agree within the floor "
        "up to a position > 0 and part from there"
        + (f" (positions {', '.join(map(str, at[:8]))})" if at else "")
        + f"; a token past its first is back within the floor {chance:.0%} of the time"
    )
    fit, evidence = _unsure(fit, evidence, floor)
    depth, where = _divergence_depth(layers)
    if depth:
        return Cause("token-mismatch", 0.0, fit, f"{evidence}; but {where}: the inputs agree up to there")
    return Cause("token-mismatch", fit, fit, evidence + "; a token changed on one side leaves the prefix equal")


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


def _error(module: dict[str, Any]) -> float | None:
    """A module's error in either of msprobe's modes: MaxAbsErr (tensor) or |Max diff| (statistics)."""
    value = module["max_abs_err"] if module["max_abs_err"] is not None else module["max_diff"]
    return None if value is None else float(value)


def layer_floor(layers: dict[str, Any] | None) -> dict[str, float] | None:
    """Per module, the largest error in the pairs msprobe finds within its thresholds (the same computation on
    both sides, as the demo's same-weights run): the layer compare's own noise floor; None without such a pair."""
    agreeing = [p for p in (layers or {}).get("pairs", []) if p["first_divergence"] is None]
    if not agreeing:
        return None
    floor: dict[str, float] = {}
    for pair in agreeing:
        for m in pair["modules"]:
            error = _error(m)
            if error is not None:
                floor[m["module"]] = max(floor.get(m["module"], 0.0), error)
    return floor


def _out_of_layer_floor(module: dict[str, Any], floor: dict[str, float], typical: float) -> bool:
    # above FLOOR_FACTOR times the module's own floor and the typical module's (a floor of 0: no rounding there)
    error = _error(module)
    return error is not None and error > FLOOR_FACTOR * max(floor.get(module["module"], 0.0), typical)


def _first_common(layers: dict[str, Any]) -> tuple[str | None, str]:
    """The first module out of the floor in every disagreeing pair: the layer floor's where agreeing pairs give
    one, else msprobe's thresholds'."""
    floor = layer_floor(layers)
    if floor is None:
        return layers["first_common_divergence"], "out of msprobe's thresholds"
    typical = float(np.median(list(floor.values()))) if floor else 0.0
    disagreeing = [p for p in layers["pairs"] if p["label"] in set(layers["disagreeing_pairs"])]
    out = [{m["module"] for m in p["modules"] if _out_of_layer_floor(m, floor, typical)} for p in disagreeing]
    shared = set.intersection(*out) if out else set()
    first = next((m["module"] for m in disagreeing[0]["modules"] if m["module"] in shared), None)
    agreeing = len(layers["pairs"]) - len(disagreeing)
    return first, (
        f"out of the layer floor ({FLOOR_FACTOR:g}x each module's largest error in the {agreeing} pair(s) within "
        f"msprobe's thresholds, and at least {FLOOR_FACTOR:g}x the median module's, {_g(typical)})"
    )


def _divergence_depth(layers: dict[str, Any] | None) -> tuple[int | None, str]:
    """Where the first module out of the floor in every disagreeing pair sits in the forward order (0: the first)."""
    if not layers or not layers["disagreeing_pairs"]:
        return None, "no layer compare with a disagreeing pair"
    common, how = _first_common(layers)
    if common is None:
        return None, f"{len(layers['disagreeing_pairs'])} disagreeing pair(s), no first module {how} in common"
    pair = next(p for p in layers["pairs"] if p["label"] == layers["disagreeing_pairs"][0])
    names = [m["module"] for m in pair["modules"]]
    depth = names.index(common)
    return depth, (
        f"the first module {how} in every one of {len(layers['disagreeing_pairs'])} disagreeing pair(s) is "
        f"{common} (module {depth + 1} of {len(names)})"
    )


def _layers_agree(layers: dict[str, Any] | None) -> str:
    """What the layer compare says when every pair is within msprobe's thresholds ("" when it does not)."""
    if not layers or not layers["pairs"] or layers["disagreeing_pairs"]:
        return ""
    return (
        f"the layer compare agrees in all {len(layers['pairs'])} pair(s): the weights and the forward are the same "
        "on both sides"
    )


def broken_layer(tokens: Tokens, floor: Floor, layers: dict[str, Any] | None) -> Cause:
    share, said = _first_token_share(tokens, floor)
    if agree := _layers_agree(layers):
        return Cause("broken-layer", 0.0, 0.0, f"{said}; but {agree}")
    depth, where = _divergence_depth(layers)
    if depth is None:
        # the tokens alone cannot tell one layer from every weight: half the fit, and the layer compare to ask
        return Cause("broken-layer", share / 2, share / 2, f"{said}; {where}: the layer compare would tell")
    # the layer compare sees the forward itself: a first common divergence inside the model names the layer
    fit = 1.0 if depth > 0 else 0.0
    return Cause("broken-layer", fit, fit, f"{where}; {said}" + ("" if depth else ": the first module, not one layer"))


def stale_weights(tokens: Tokens, floor: Floor, layers: dict[str, Any] | None) -> Cause:
    share, said = _first_token_share(tokens, floor)
    if agree := _layers_agree(layers):
        return Cause("stale-weights", 0.0, 0.0, f"{said}; but {agree}")
    depth, where = _divergence_depth(layers)
    if depth is None:
        return Cause("stale-weights", share / 2, share / 2, f"{said}; {where}: the layer compare would tell")
    fit = share if depth == 0 else 0.0
    return Cause(
        "stale-weights", fit, fit, f"{said}; {where}" + ("" if depth == 0 else ": one layer, not every weight")
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
    thirds = [
        f"{_g(float(tokens.abs_dlogp[part & tail].sum() / max(tokens.abs_dlogp[part].sum(), 1e-300)))}"
        for part in _thirds(tokens)
    ]
    evidence = (
        f"tokens of p < {TAIL_P} hold {share:.0%} of sum |dlogp| and are {token_share:.0%} of the tokens; their share "
        f"by position (first, middle, last third of the responses): {', '.join(thirds)}"
    )
    return Cause("low-probability-tail", fit, fit, evidence)


def _thirds(tokens: Tokens) -> list[Any]:
    length = np.maximum(tokens.counts[tokens.row], 1)
    third = np.minimum(3 * tokens.position // length, 2)
    return [third == k for k in range(3)]


def precision_noise(mean: float, floor: Floor) -> Cause:
    excess = mean / floor.mean_limit
    # out of the floor: at most a quarter (below a cause whose signature half fits), less the further out
    fit = 1.0 if excess <= 1.0 else 0.25 / excess
    where = "within" if excess <= 1.0 else "above"
    evidence = (
        f"mean |dlogp| {_g(mean)} is {where} the floor's limit {_g(floor.mean_limit)} ({_g(excess)}x; "
        f"{'measured' if floor.measured else 'not measured: the fixed gate'})"
    )
    return Cause("precision-noise", fit, fit, evidence)


# --- ranking ---------------------------------------------------------------------------------------------


def _ranked(causes: list[Cause]) -> list[Cause]:
    order = list(TITLES)
    return sorted(causes, key=lambda c: (-c.score, order.index(c.cause)))


def diagnose_step(
    tokens: Tokens, floor: Floor, layers: dict[str, Any] | None, sampling: dict[str, Any] | None = None
) -> tuple[bool, float, list[Cause]]:
    """Whether the step is within the floor, its mean |d|, and its causes ranked."""
    mean = float(tokens.abs_dlogp.mean())
    within = mean <= floor.mean_limit
    causes = [
        logprob_kind(tokens, sampling),
        token_mismatch(tokens, floor, layers),
        stale_weights(tokens, floor, layers),
        broken_layer(tokens, floor, layers),
        low_probability_tail(tokens),
    ]
    if within:
        for c in causes:
            c.score = 0.0
    return within, mean, _ranked([*causes, precision_noise(mean, floor)])


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


def choose_floor(batches: list[TokenBatch], baseline: list[TokenBatch], floor_step: int | None) -> Floor:
    """The floor from the baseline captures (`--baseline`), or from step `floor_step` of the inputs, else none."""
    if baseline and floor_step is not None:
        raise RefusedError("--baseline and --floor-step both name a noise floor: give one")
    if baseline:
        where = ", ".join(sorted({b.path for b in baseline}))
        # what the baseline is, as its writer said it (`source`), else what --baseline asks for
        said = "; ".join(sorted({b.source for b in baseline if b.source})) or "the same computation twice"
        return measure_floor(baseline, f"measured on the baseline capture(s) {where} ({said})")
    if floor_step is not None:
        chosen = [b for b in batches if b.step == floor_step]
        if not chosen:
            steps = ", ".join(str(b.step) for b in batches)
            raise RefusedError(f"--floor-step {floor_step}: no such step in the inputs (steps {steps})")
        return measure_floor(
            chosen, f"measured on step {floor_step} of the inputs (given as run with the same weights)"
        )
    return no_floor("no noise floor measured (no --baseline, no --floor-step)")


def diagnose(
    batches: list[TokenBatch],
    layers: dict[str, Any] | None,
    floor: Floor,
    script: str | None = None,
    sampling: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The diagnosis document: the floor, each step's causes ranked, and the run's (each cause's best step);
    `sampling` is the run's rollout settings (`run_sampling`), where its launch script was read: a step whose
    capture recorded its own (`TokenBatch.sampling`) is judged against those."""
    steps: list[dict[str, Any]] = []
    best: dict[str, Cause] = {}
    means = []
    for b in sorted(batches, key=lambda b: (b.step is None, b.step or 0)):
        tokens = Tokens.of(b.rollout, b.training, b.mask)
        if not tokens.size:
            continue
        # the settings the capture recorded for its step, else the launch script's
        settings = {"source": f"step {b.step}'s capture", **b.sampling} if b.sampling is not None else sampling
        within, mean, causes = diagnose_step(tokens, floor, layers, settings)
        means.append(mean)
        steps.append(
            {
                "step": b.step,
                "kind": b.kind,
                "mean_abs_dlogp": mean,
                "within_floor": within,
                "sampling": settings,
                "causes": [_plain(c) for c in causes],
            }
        )
        for c in causes:
            # the step that shows the cause best: by score, then by fit (the evidence of a step out of the floor)
            if c.cause not in best or (c.score, c.fit) > (best[c.cause].score, best[c.cause].fit):
                best[c.cause] = Cause(c.cause, c.score, c.fit, f"step {b.step}: {c.evidence}")
    trend = growth_and_reset(means, floor)
    if "stale-weights" in best and trend.score > best["stale-weights"].score:
        best["stale-weights"] = trend
    if steps:
        # noise is judged on the run's worst step: a run with a step out of the floor is not noise only
        worst = max(steps, key=lambda s: s["mean_abs_dlogp"])
        noise = precision_noise(worst["mean_abs_dlogp"], floor)
        best["precision-noise"] = Cause(
            "precision-noise", noise.score, noise.fit, f"step {worst['step']}: {noise.evidence}"
        )
    ranked = _ranked(list(best.values()))
    for c in ranked:
        c.confirm = confirm_lines(c.cause, script, sampling_of(steps, c.cause))
    return {
        "floor": asdict(floor),
        "sampling": sampling,
        "causes": [_plain(c) for c in ranked],
        "top": ranked[0].cause if ranked else None,
        "steps": steps,
    }


def _plain(cause: Cause) -> dict[str, Any]:
    return asdict(cause) | {"confirm": list(cause.confirm)}
