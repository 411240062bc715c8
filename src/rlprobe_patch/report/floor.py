"""The noise floor of a train-vs-rollout gap, and the three tests a step's tokens take against it.

The floor is measured on two computations of the same tokens that should agree (`--baseline`: the training side
against the rollout engine, the same weights, nothing planted; or `--floor-step N`), never tighter than the compute
dtype resolves. In float32 it is rounding (1e-5); in bfloat16 it is the trainer's own batch variance (0.04 mean
|dlogp| on an H100, p99 0.17), and a cause can change the distribution of the gap while its mean stays under a limit
set at a few times the floor's mean. So a step is judged on the distribution, three ways, each of which takes it out:

- **mean**: its mean |dlogp| above `FLOOR_FACTOR` times the floor's;
- **tail**: its share of tokens beyond the floor's 99th percentile `FLOOR_FACTOR` times the floor's own share of such
  tokens or more (a broken layer: a third of the tokens, against 1 % for noise);
- **sign**: its d = log p_train - log p_rollout one-signed as the floor's is not, and its mean d shifted from the
  floor's by more than the floor's mean |d| (top-p renormalisation: every token's rollout log-prob above the
  trainer's; no two-sided noise makes that).

The tail and sign tests ask, besides the size of the difference, that it be no chance: the Chernoff bound on the
binomial tail, exp(-n KL(share || floor's share)), below `CHANCE` (an upper bound on the p-value, so a step that
passes it is out of the floor by at least that significance). The floor's shares are counted with the rule of
succession ((k + 1) / (n + 2)), so a small floor never claims a share of 0 or 1. Without a measured floor only the
mean test runs, against NeMo-RL's fixed gate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlprobe_patch.base.errors import RefusedError
from rlprobe_patch.report.capture_format import TokenBatch
from rlprobe_patch.report.metrics import Tokens
from rlprobe_patch.report.verdict import TME_GATE, TME_SOURCE
from rlprobe_patch.report.verdict import figure as _g

FLOOR_FACTOR = 4.0  # how far above the floor's spread a step or a token must be to leave it
CHANCE = 1e-4  # a tail or a sign this unlikely from the floor's own distribution (bound on the p-value) is not noise
TAIL_QUANTILE = 0.99  # the floor's high quantile of |dlogp| whose share of tokens beyond it the tail test compares
ULPS = 2.0  # the rounding of a log-prob in its compute dtype, in units of that dtype's epsilon
# the unit roundoff of each compute dtype a log-prob may have been computed in
EPSILON = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
DTYPE_NAMES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "half": "float16", "float": "float32"}


def dtype_name(value: Any) -> str | None:
    """A dtype as the records and configs write it (`torch.bfloat16`, `bf16`, `float32`), by its full name."""
    if not isinstance(value, str) or not value:
        return None
    name = value.strip().lower().removeprefix("torch.")
    return DTYPE_NAMES.get(name, name)


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
    dtype: str = "float32"  # the coarsest dtype of the computations it measured
    split: dict[str, float] | None = None  # trainer vs the engine's prefill, prefill vs decode (means)
    # the distribution tests (measured floors only): the tail's level and the floor's share beyond it, the floor's
    # share of d < 0 and its mean d, and how far a one-signed step's mean d must move from it
    tail_limit: float | None = None
    tail_share: float | None = None
    negative_share: float | None = None
    mean_dlogp: float | None = None
    shift_limit: float | None = None
    # the (training, rollout) compute dtypes every computation of the floor recorded, where they all agree
    sides: tuple[str | None, str | None] | None = None


def resolution(dtype: str, logp: Any) -> tuple[float, float]:
    """What a log-prob computed in `dtype` resolves, for one token and for a mean: a few units of the dtype's
    epsilon, relative to the log-probs' size (at least the float32 capture's own rounding)."""
    eps = max(EPSILON.get(dtype, EPSILON["float32"]), EPSILON["float32"])
    size = np.abs(logp)
    largest = float(size.max()) if size.size else 1.0
    typical = float(size.mean()) if size.size else 1.0
    return ULPS * eps * max(1.0, largest), ULPS * eps * max(1.0, typical)


def split_means(tokens: Tokens, prefill: Any) -> dict[str, float] | None:
    """The three-way split where the engine's prefill re-score exists: mean |trainer - prefill| (two
    implementations), mean |prefill - decode| (the engine against itself: cache, batch, kernels, the kind of
    log-probs it returns), and the whole gap's."""
    if prefill is None or not tokens.size:
        return None
    return {
        "trainer_vs_prefill": float(np.abs(tokens.training - prefill).mean()),
        "prefill_vs_decode": float(np.abs(prefill - tokens.rollout).mean()),
        "trainer_vs_decode": float(tokens.abs_dlogp.mean()),
    }


def succession(count: int, total: int) -> float:
    """A share estimated by the rule of succession: never 0 or 1 from a finite sample."""
    return (count + 1) / (total + 2)


def measure_floor(batches: list[TokenBatch], how: str) -> Floor:
    """The floor from `batches`, two computations of the same tokens that should agree (`how` says which)."""
    tokens = Tokens.join([(b.rollout, b.training, b.mask, None) for b in batches])
    if not tokens.size:
        return no_floor(f"{how} has no response token: no floor measured")
    d, signed = tokens.abs_dlogp, tokens.log_ratio
    sides = {_sides(b.provenance) for b in batches}
    dtype = _coarsest([s for pair in sides for s in pair if s]) or "float32"
    token_res, mean_res = resolution(dtype, tokens.rollout)
    mean, p99 = float(d.mean()), float(np.quantile(d, TAIL_QUANTILE))
    tail_limit = max(p99, token_res)
    tail_share = succession(int((d > tail_limit).sum()), tokens.size)
    nonzero = int((signed != 0).sum())
    negative_share = succession(int((signed < 0).sum()), nonzero)
    prefill = [b for b in batches if b.prefill is not None]
    split = None
    if prefill and len(prefill) == len(batches):
        split = split_means(tokens, np.concatenate([b.prefill[b.mask] for b in batches]))  # type: ignore[index]
    said = (
        f"; trainer vs the engine's prefill {_g(split['trainer_vs_prefill'])}, prefill vs decode "
        + _g(split["prefill_vs_decode"])
        if split
        else ""
    )
    shift_limit = max(mean, mean_res)
    return Floor(
        measured=True,
        how=f"{how}: {tokens.size} tokens, mean |dlogp| {_g(mean)}, 99th percentile {_g(p99)}{said}; a step leaves it "
        f"above {FLOOR_FACTOR:g}x the mean, with {FLOOR_FACTOR:g}x the floor's share of tokens beyond its 99th "
        f"percentile ({tail_share:.1%}) or more, or one-signed beyond the floor's (d < 0 on {negative_share:.0%} of "
        f"its tokens) with its mean d moved by more than {_g(shift_limit)}, the last two at a chance below {CHANCE:g}; "
        f"a token leaves it above {FLOOR_FACTOR:g}x the 99th percentile (each at least what {dtype} resolves: "
        f"{_g(mean_res)} for a mean, {_g(token_res)} for a token)",
        mean_limit=FLOOR_FACTOR * shift_limit,
        token_limit=FLOOR_FACTOR * max(p99, token_res),
        tokens=tokens.size,
        mean_abs_dlogp=mean,
        p99_abs_dlogp=p99,
        max_abs_dlogp=float(d.max()),
        dtype=dtype,
        split=split,
        tail_limit=tail_limit,
        tail_share=tail_share,
        negative_share=negative_share,
        mean_dlogp=float(signed.mean()),
        shift_limit=shift_limit,
        sides=next(iter(sides)) if len(sides) == 1 else None,
    )


def no_floor(why: str) -> Floor:
    """NeMo-RL's fixed gate in place of a measured floor: mean exp(|d|) 1.05, so |d| about log 1.05."""
    gate = math.log(TME_GATE)
    return Floor(
        measured=False,
        how=f"{why}; the fixed gate stands in: mean exp(|dlogp|) {TME_GATE} ({TME_SOURCE}), |dlogp| {_g(gate)} "
        "(give --baseline CAPTURE: the training side against the rollout engine on the same weights with nothing "
        "planted, e.g. a clean step captured the same way; or --floor-step N, such a step of the inputs)",
        mean_limit=gate,
        token_limit=gate,
    )


def _sides(provenance: dict[str, Any] | None) -> tuple[str | None, str | None]:
    """(training, rollout) compute dtypes as a capture's provenance records them."""
    return dtype_name((provenance or {}).get("training_dtype")), dtype_name((provenance or {}).get("rollout_dtype"))


def _coarsest(dtypes: list[str]) -> str | None:
    known = [d for d in dtypes if d in EPSILON]
    return max(known, key=EPSILON.__getitem__) if known else None


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


# --- a step against the floor ------------------------------------------------------------------------------


def chance_bound(count: int, total: int, share: float) -> float:
    """An upper bound on P(X >= count), X ~ Binomial(total, share): Chernoff's exp(-total KL(count/total || share))
    where count/total exceeds share, else 1. One line for any number of tokens, and conservative: a step it calls
    unlikely is at least that unlikely."""
    if not total or count <= total * share:
        return 1.0
    seen = count / total
    kl = seen * math.log(seen / share)
    if seen < 1.0:
        kl += (1.0 - seen) * math.log((1.0 - seen) / (1.0 - share))
    return math.exp(-total * kl)


@dataclass(frozen=True)
class FloorTest:
    name: str  # "mean", "tail", "sign"
    leaves: bool
    said: str


@dataclass(frozen=True)
class FloorReading:
    """A step's tokens against the floor: each test, whether it takes the step out of the floor, and what it read."""

    tests: tuple[FloorTest, ...]

    @property
    def leaving(self) -> list[str]:
        """The tests that take the step out of the floor: "mean", "tail", "sign"."""
        return [t.name for t in self.tests if t.leaves]

    @property
    def within(self) -> bool:
        return not self.leaving

    def said(self) -> str:
        """What each test read, those that take the step out first (by "but")."""
        out = [t.said for t in self.tests if t.leaves]
        kept = [t.said for t in self.tests if not t.leaves]
        return "; ".join(kept) + (("; but " if kept else "") + "; and ".join(out) if out else "")


def read_floor(tokens: Tokens, floor: Floor) -> FloorReading:
    """The step's tokens against the floor: the mean always, the tail and the sign where the floor was measured.
    Taken once per step (the diagnosis and the precision-noise evidence read it)."""
    return tokens.memo(("floor", floor.how), lambda: _read_floor(tokens, floor))


def _read_floor(tokens: Tokens, floor: Floor) -> FloorReading:
    mean = float(tokens.abs_dlogp.mean()) if tokens.size else 0.0
    excess = mean / floor.mean_limit if floor.mean_limit else math.inf
    where, how = "above" if mean > floor.mean_limit else "within", "measured" if floor.measured else "not measured"
    said = f"mean |dlogp| {_g(mean)} is {where} the floor's limit {_g(floor.mean_limit)} ({_g(excess)}x; {how}"
    tests = [FloorTest("mean", mean > floor.mean_limit, said + ("" if floor.measured else ": the fixed gate") + ")")]
    if floor.measured and tokens.size:
        tests += [_tail_test(tokens, floor), _sign_test(tokens, floor)]
    return FloorReading(tuple(tests))


def _tail_test(tokens: Tokens, floor: Floor) -> FloorTest:
    assert floor.tail_limit is not None and floor.tail_share is not None
    beyond, total = int((tokens.abs_dlogp > floor.tail_limit).sum()), tokens.size
    share, expected = beyond / total, floor.tail_share
    chance = chance_bound(beyond, total, expected)
    leaves = share >= FLOOR_FACTOR * expected and chance < CHANCE
    return FloorTest(
        "tail",
        leaves,
        ("a tail: " if leaves else "")
        + f"{beyond} of {total} tokens ({share:.1%}) beyond the floor's 99th percentile {_g(floor.tail_limit)}, where "
        f"the floor has {expected:.1%} (as many by chance: at most {chance:.2g})",
    )


def _sign_test(tokens: Tokens, floor: Floor) -> FloorTest:
    assert floor.negative_share is not None and floor.mean_dlogp is not None and floor.shift_limit is not None
    d = tokens.log_ratio
    signed = int((d != 0).sum())
    negative = int((d < 0).sum())
    expected = floor.negative_share
    share = negative / signed if signed else expected
    # the side the step leans to, against the floor's lean to that side
    if share >= expected:
        chance = chance_bound(negative, signed, expected)
    else:
        chance = chance_bound(signed - negative, signed, 1.0 - expected)
    mean_d = float(d.mean())
    shift = abs(mean_d - floor.mean_dlogp)
    leaves = chance < CHANCE and shift > floor.shift_limit
    return FloorTest(
        "sign",
        leaves,
        ("one-signed: " if leaves else "")
        + f"d < 0 on {share:.0%} of {signed} tokens, where the floor has {expected:.0%} (as lopsided by chance: at "
        f"most {chance:.2g}), its mean d {_g(mean_d)} against the floor's {_g(floor.mean_dlogp)} (moved by "
        f"{_g(shift)}, the floor's mean |d| {_g(floor.shift_limit)})",
    )
