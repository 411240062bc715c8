"""Token-level mismatch numbers, with verl's own definitions, in numpy.

verl computes two sets on every step of a run with `rollout.calculate_log_probs=True`; they are
re-implemented here from their definitions (not copied), and `tests/runtime/test_report_runtime.py`
proves them equal to verl's own functions (the release of the runtime venv) on the same tensors:

- `debug_metrics`: `verl/utils/debug/metrics.py::calculate_debug_metrics`: over the response
  mask, |p_train - p_rollout| (probabilities, `exp` of the log-probs): max, mean, std (unbiased),
  and the Pearson correlation of the two probabilities; `valid` 0 and NaNs without a token.
- `offpolicy_metrics`: `verl/trainer/ppo/rollout_corr_helper.py::compute_offpolicy_metrics`:
  per-sequence masked means (`sum / (count + 1e-8)`, the sum in float32 as verl's masks make it, so
  an empty response counts as 0), the
  training and rollout PPL (batch mean of `exp(-mean log p)`), kl (`E[log p_rollout - log p_train]`),
  k3_kl (`E[r - log r - 1]`, r = p_train / p_rollout), log_ppl_diff (mean, |mean|, max, min),
  ppl_ratio, chi2_token (`E[r^2] - 1`, log r clamped to +-20) and chi2_seq (`mean((prod r)^2) - 1`,
  the sum of log r clamped to +-20).

Everything else here is the report's own: per-request figures, the worst tokens, the
difference against the position in the response and against the token's probability.
The public functions take padded (N, R) arrays and a boolean mask, as in a capture; each is a thin
layer over `Tokens`, the valid tokens alone in row order with each row's count, which the report
lays out for groups of consecutive steps (`build.step_tokens`): every figure is then a vectorised reduction
(`np.bincount`, `np.maximum.reduceat`) over about as many numbers as there are response tokens,
never over the padding, and no Python loop runs per token.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

_T = TypeVar("_T")
FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

_EPS = 1e-8  # verl's masked_mean adds it to the count
_SAFETY_BOUND = 20.0  # verl's clamp of log-ratios in the chi-squared estimates


# Per-token values (one per valid token) and per-row values (one per row) that a part of a run
# takes from the run, sliced: each is computed once, over every step's tokens.
_PER_TOKEN = frozenset({"p_train", "p_rollout", "abs_dp", "abs_dlogp", "log_ratio", "k3_terms", "rho_squared"})
_PER_ROW = frozenset({"row_sum_training", "row_sum_rollout", "row_sum_log_ratio"})
_ROW_VALUES = _PER_ROW | {"starts"}  # one number a row: what `Tokens.forget` keeps


@dataclass
class Tokens:
    """The valid tokens of a batch (or of several), row after row, and what every figure derives from them.

    `join` lays several batches one after the other (a group of steps) and `parts` gives each batch back as
    views of its arrays: a per-token or per-row value a part needs is computed once over the group and
    sliced; `forget` frees what was made once the parts' figures are taken.
    """

    training: FloatArray
    rollout: FloatArray
    counts: IntArray  # valid tokens per row (0 for an empty row)
    token_ids: IntArray | None = None
    part_rows: list[int] = field(default_factory=list)  # rows of each batch `join` took
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)
    _whole: tuple[Tokens, slice, slice] | None = field(default=None, repr=False)  # the run, its tokens, its rows

    @classmethod
    def of(
        cls, rollout: FloatArray, training: FloatArray, mask: BoolArray, responses: IntArray | None = None
    ) -> Tokens:
        return cls(
            training=training[mask],
            rollout=rollout[mask],
            counts=mask.sum(axis=1).astype(np.int64),
            token_ids=responses[mask] if responses is not None else None,
            part_rows=[mask.shape[0]],
        )

    @classmethod
    def join(cls, batches: list[tuple[FloatArray, FloatArray, BoolArray, IntArray | None]]) -> Tokens:
        """The valid tokens of `batches` (rollout, training, mask, responses or None), one batch after the
        other, each array allocated once and filled batch by batch."""
        counts = [mask.sum(axis=1).astype(np.int64) for _, _, mask, _ in batches]
        total = int(sum(int(c.sum()) for c in counts))
        dtype = np.result_type(*(a.dtype for r, t, _, _ in batches for a in (r, t))) if batches else np.float64
        training, rollout = np.empty(total, dtype=dtype), np.empty(total, dtype=dtype)
        with_ids = bool(batches) and all(x is not None for *_, x in batches)
        ids = np.empty(total, dtype=np.result_type(*(x.dtype for *_, x in batches))) if with_ids else None  # type: ignore[union-attr]
        start = 0
        for (r, t, mask, x), count in zip(batches, counts):
            stop = start + int(count.sum())
            training[start:stop], rollout[start:stop] = t[mask], r[mask]
            if ids is not None:
                ids[start:stop] = x[mask]  # type: ignore[index]
            start = stop
        return cls(
            training=training,
            rollout=rollout,
            counts=np.concatenate(counts) if counts else np.zeros(0, dtype=np.int64),
            token_ids=ids,
            part_rows=[c.size for c in counts],
        )

    def parts(self) -> Iterator[Tokens]:
        """Each batch `join` took, as views of this one's arrays (one at a time: what a part computes for
        itself is freed with it)."""
        first_token = first_row = 0
        for rows in self.part_rows:
            counts = self.counts[first_row : first_row + rows]
            tokens = slice(first_token, first_token + int(counts.sum()))
            yield Tokens(
                training=self.training[tokens],
                rollout=self.rollout[tokens],
                counts=counts,
                token_ids=self.token_ids[tokens] if self.token_ids is not None else None,
                part_rows=[rows],
                _whole=(self, tokens, slice(first_row, first_row + rows)),
            )
            first_token, first_row = tokens.stop, first_row + rows

    def part_list(self) -> list[Tokens]:
        """`parts()`, kept: what each part computes for itself (its rows, positions) is kept with it, for the
        report's figures and its diagnosis both."""
        if "parts" not in self._cache:
            self._cache["parts"] = list(self.parts())
        return self._cache["parts"]  # type: ignore[no-any-return]

    def make(self, *names: str) -> None:
        """Compute the per-token values `names` now (threads that read them later then find them made)."""
        for name in names:
            self._get(name)

    @property
    def whole(self) -> Tokens:
        """The tokens these are a part of (`join`'s, through `parts`), else these."""
        return self._whole[0] if self._whole is not None else self

    def forget(self, *keep: str) -> None:
        """Drop the per-token values made so far (one number a token), but `keep`; the per-row values and every figure
        `memo` keeps stay. A run's steps each make eight values a token for their figures, its largest memory by far,
        and a step's freed arrays are where the next step's are made (memory the process has touched already)."""
        for name, value in list(self._cache.items()):
            if isinstance(name, str) and name not in keep and name not in _ROW_VALUES and isinstance(value, np.ndarray):
                del self._cache[name]

    def memo(self, key: Any, make: Callable[[], _T]) -> _T:
        """`make()`, computed once for these tokens under `key` (a figure several callers derive alike)."""
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]  # type: ignore[no-any-return]

    def _get(self, name: str) -> Any:
        if name not in self._cache:
            if self._whole is not None and (name in _PER_TOKEN or name in _PER_ROW):
                whole, tokens, rows = self._whole
                self._cache[name] = whole._get(name)[tokens if name in _PER_TOKEN else rows]
            else:
                self._cache[name] = getattr(self, "_make_" + name)()
        return self._cache[name]

    @property
    def size(self) -> int:
        return int(self.training.size)

    @property
    def p_train(self) -> FloatArray:
        return self._get("p_train")  # type: ignore[no-any-return]

    @property
    def p_rollout(self) -> FloatArray:
        return self._get("p_rollout")  # type: ignore[no-any-return]

    @property
    def abs_dp(self) -> FloatArray:
        return self._get("abs_dp")  # type: ignore[no-any-return]

    @property
    def abs_dlogp(self) -> FloatArray:
        return self._get("abs_dlogp")  # type: ignore[no-any-return]

    @property
    def log_ratio(self) -> FloatArray:
        """log p_train - log p_rollout, per token."""
        return self._get("log_ratio")  # type: ignore[no-any-return]

    @property
    def row(self) -> IntArray:
        """Each token's row."""
        return self._get("row")  # type: ignore[no-any-return]

    @property
    def starts(self) -> IntArray:
        """Each row's first token (its end for an empty row)."""
        return self._get("starts")  # type: ignore[no-any-return]

    @property
    def position(self) -> IntArray:
        """Each token's position among its row's valid tokens."""
        return self._get("position")  # type: ignore[no-any-return]

    def _make_p_train(self) -> FloatArray:
        return np.exp(self.training)

    def _make_p_rollout(self) -> FloatArray:
        return np.exp(self.rollout)

    def _make_abs_dp(self) -> FloatArray:
        diff = self.p_train - self.p_rollout
        return np.abs(diff, out=diff)

    def _make_abs_dlogp(self) -> FloatArray:
        return np.abs(self.log_ratio)

    def _make_log_ratio(self) -> FloatArray:
        return self.training - self.rollout

    def _make_k3_terms(self) -> FloatArray:
        # r = p_train / p_rollout = exp(log r), computed once for both of verl's estimates that use it
        ratio = np.exp(self.log_ratio)
        self._cache["rho_squared"] = self._rho_squared(ratio)
        terms = ratio  # r - log r - 1, in r's own array
        terms -= self.log_ratio
        terms -= 1.0
        return terms

    def _make_rho_squared(self) -> FloatArray:
        return self._rho_squared(np.exp(self.log_ratio))

    def _rho_squared(self, ratio: FloatArray) -> FloatArray:
        # r with log r clamped to +-20, squared: r itself where the clamp changes nothing (the same exp of
        # the same number), recomputed only where it does
        rho = ratio * ratio
        clamped = np.flatnonzero(self.abs_dlogp > _SAFETY_BOUND)  # |log r|, which the profiles use too
        if clamped.size:
            bounded = np.exp(np.clip(self.log_ratio[clamped], -_SAFETY_BOUND, _SAFETY_BOUND))
            rho[clamped] = bounded * bounded
        return rho

    def _make_row_sum_training(self) -> FloatArray:
        return self.row_sums(self.training)  # type: ignore[no-any-return]

    def _make_row_sum_rollout(self) -> FloatArray:
        return self.row_sums(self.rollout)  # type: ignore[no-any-return]

    def _make_row_sum_log_ratio(self) -> FloatArray:
        return self.row_sums(self.log_ratio)  # type: ignore[no-any-return]

    def _make_row(self) -> IntArray:
        return np.repeat(np.arange(self.counts.size, dtype=np.int64), self.counts)

    def _make_starts(self) -> IntArray:
        return np.concatenate([[0], np.cumsum(self.counts)[:-1]]).astype(np.int64)

    def _make_position(self) -> IntArray:
        position = np.arange(self.size, dtype=np.int64)
        position -= self.starts[self.row]
        return position

    def row_sums(self, values: Any) -> Any:
        """Per row, the sum of `values` (one per token); 0 for an empty row."""
        sums = np.zeros(self.counts.size, dtype=np.result_type(values, np.float64))
        if self.size:
            sums[self.counts > 0] = np.add.reduceat(values, self.starts[self.counts > 0])
        return sums

    def row_max(self, values: Any) -> Any:
        """Per non-empty row (in row order), the largest value."""
        return np.maximum.reduceat(values, self.starts[self.counts > 0]) if self.size else np.zeros(0)


def debug_metrics(rollout: FloatArray, training: FloatArray, mask: BoolArray) -> dict[str, float]:
    """`training/rollout_probs_diff_*` and `training/rollout_actor_probs_pearson_corr`."""
    return tokens_debug_metrics(Tokens.of(rollout, training, mask))


def tokens_debug_metrics(tokens: Tokens) -> dict[str, float]:
    return debug_figures(PartSums.of(tokens))


@dataclass(frozen=True)
class PartSums:
    """A part's token figures as sums: its count, sums, extremes, and sums of squared deviations from its own means
    (numpy's two passes for a variance). A run's figures are combined from its steps' (`combine`), with no pass over
    its tokens of their own; one part's figures are numpy's own (`np.mean`, `np.std`, the two-pass Pearson)."""

    n: int = 0
    dp_sum: float = 0.0  # |p_train - p_rollout|
    dp_m2: float = 0.0
    dp_max: float = -math.inf
    train_sum: float = 0.0  # p_train and p_rollout, for their correlation
    rollout_sum: float = 0.0
    train_m2: float = 0.0
    rollout_m2: float = 0.0
    co_m2: float = 0.0  # sum of the product of the two deviations
    ceiling_sum: float = 0.0  # max(p_train, p_rollout)
    dlogp_sum: float = 0.0
    dlogp_max: float = -math.inf
    multiplicative_sum: float = 0.0  # exp(|dlogp|)

    @classmethod
    def of(cls, tokens: Tokens) -> PartSums:
        n = tokens.size
        if not n:
            return cls()
        dp, train, rollout, dlogp = tokens.abs_dp, tokens.p_train, tokens.p_rollout, tokens.abs_dlogp
        sums = [float(values.sum()) for values in (dp, train, rollout)]
        deviations = [values - total / n for values, total in zip((dp, train, rollout), sums)]
        # each product into one scratch array, summed (not np.dot: a BLAS call wakes its thread pool, slower than the
        # sum here, and sums in another order)
        products = np.empty_like(deviations[0])
        dp_m2, train_m2, rollout_m2 = (float(np.multiply(d, d, out=products).sum()) for d in deviations)
        co_m2 = float(np.multiply(deviations[1], deviations[2], out=products).sum())
        return cls(
            n=n,
            dp_sum=sums[0],
            dp_m2=dp_m2,
            dp_max=float(dp.max()),
            train_sum=sums[1],
            rollout_sum=sums[2],
            train_m2=train_m2,
            rollout_m2=rollout_m2,
            co_m2=co_m2,
            ceiling_sum=float(np.maximum(train, rollout, out=products).sum()),
            dlogp_sum=float(dlogp.sum()),
            dlogp_max=float(dlogp.max()),
            multiplicative_sum=float(np.exp(dlogp, out=products).sum()),
        )

    @classmethod
    def combine(cls, parts: list[PartSums]) -> PartSums:
        """The parts' figures as one part's: the sums added exactly rounded (`math.fsum`), the squared deviations
        by Chan, Golub and LeVeque's update (each part's own, plus its count times its mean's distance from the
        whole's, squared). One part is itself."""
        parts = [p for p in parts if p.n]
        if len(parts) == 1:
            return parts[0]
        n = sum(p.n for p in parts)
        if not n:
            return cls()
        total: dict[str, float] = {
            name: math.fsum(getattr(p, name) for p in parts)
            for name in ("dp_sum", "train_sum", "rollout_sum", "ceiling_sum", "dlogp_sum", "multiplicative_sum")
        }

        def spread(own: str, a: str, b: str) -> float:
            """The whole's sum of products of the deviations of `a` and `b` (`a` twice: its squared deviations),
            from the parts' own (`own`) and their means' distances from the whole's."""
            between = [p.n * (getattr(p, a) / p.n - total[a] / n) * (getattr(p, b) / p.n - total[b] / n) for p in parts]
            return math.fsum([getattr(p, own) for p in parts] + between)

        return cls(
            n=n,
            dp_m2=spread("dp_m2", "dp_sum", "dp_sum"),
            dp_max=max(p.dp_max for p in parts),
            train_m2=spread("train_m2", "train_sum", "train_sum"),
            rollout_m2=spread("rollout_m2", "rollout_sum", "rollout_sum"),
            co_m2=spread("co_m2", "train_sum", "rollout_sum"),
            dlogp_max=max(p.dlogp_max for p in parts),
            **total,
        )


def debug_figures(sums: PartSums) -> dict[str, float]:
    """verl's `calculate_debug_metrics` from a part's sums."""
    nan = float("nan")
    if not sums.n:
        return {
            "training/rollout_probs_diff_valid": 0,
            "training/rollout_probs_diff_max": nan,
            "training/rollout_probs_diff_mean": nan,
            "training/rollout_probs_diff_std": nan,
            "training/rollout_actor_probs_pearson_corr": nan,
        }
    return {
        "training/rollout_probs_diff_valid": 1,
        "training/rollout_probs_diff_max": sums.dp_max,
        "training/rollout_probs_diff_mean": sums.dp_sum / sums.n,
        "training/rollout_probs_diff_std": math.sqrt(sums.dp_m2 / (sums.n - 1)) if sums.n > 1 else nan,
        "training/rollout_actor_probs_pearson_corr": _pearson(sums),
    }


def _pearson(sums: PartSums) -> float:
    """Pearson's correlation of the two probabilities, clamped to [-1, 1]; NaN for fewer than two tokens or a side
    without spread. Not `np.corrcoef`: its covariance is a BLAS dot product, another order of summation, whose last
    bits differ (by 1e-16 on the pinned reports, tests/report_numbers.py)."""
    if sums.n < 2:
        return float("nan")
    denominator = math.sqrt(sums.train_m2 * sums.rollout_m2)
    if denominator == 0.0:
        return float("nan")
    return max(-1.0, min(1.0, sums.co_m2 / denominator))


def _eps_count(count: Any) -> Any:
    # verl adds the epsilon to the mask's sum in float32 (its masks are bool, int or float32 tensors):
    # 1e-8 is kept for an empty row, lost on a count of 1 or more
    return (np.asarray(count, dtype=np.float32) + np.float32(_EPS)).astype(np.float64)


def offpolicy_metrics(training: FloatArray, rollout: FloatArray, mask: BoolArray) -> dict[str, float]:
    """verl's off-policy diagnostics (without verl's `rollout_corr/` prefix); {} without a token."""
    return tokens_offpolicy_metrics(Tokens.of(rollout, training, mask))


def tokens_offpolicy_metrics(tokens: Tokens) -> dict[str, float]:
    return parts_offpolicy_metrics([tokens])


def _token_sum(tokens: Tokens, name: str) -> float:
    """The sum of the per-token value `name` over `tokens` (kept: the step's figures and the run's both add it)."""
    return tokens.memo(("sum", name), lambda: float(tokens._get(name).sum()))


def parts_offpolicy_metrics(parts: list[Tokens]) -> dict[str, float]:
    """verl's off-policy figures of `parts` laid end to end (a run's steps): the rows' figures over every part's
    rows, the tokens' sums the parts' sums added exactly rounded (one part: numpy's sum over its tokens)."""
    size = sum(part.size for part in parts)
    if not size:
        return {}
    count = _eps_count(np.concatenate([part.counts for part in parts]))
    total = _eps_count(size)

    def rows(name: str) -> FloatArray:
        return np.concatenate([part._get(name) for part in parts])

    def tokens_sum(name: str) -> float:
        return math.fsum(_token_sum(part, name) for part in parts)

    mean_train = rows("row_sum_training") / count
    mean_rollout = rows("row_sum_rollout") / count
    log_ppl_diff = mean_rollout - mean_train
    seq_log_ratio = np.clip(rows("row_sum_log_ratio"), -_SAFETY_BOUND, _SAFETY_BOUND)
    return {
        "training_ppl": float(np.exp(-mean_train).mean()),
        "training_log_ppl": float((-mean_train).mean()),
        "kl": float(-tokens_sum("log_ratio") / total),
        "k3_kl": float(tokens_sum("k3_terms") / total),
        "rollout_ppl": float(np.exp(-mean_rollout).mean()),
        "rollout_log_ppl": float((-mean_rollout).mean()),
        "log_ppl_diff": float(log_ppl_diff.mean()),
        "log_ppl_abs_diff": float(np.abs(log_ppl_diff).mean()),
        "log_ppl_diff_max": float(log_ppl_diff.max()),
        "log_ppl_diff_min": float(log_ppl_diff.min()),
        "ppl_ratio": float(np.exp(log_ppl_diff).mean()),
        "chi2_token": float(tokens_sum("rho_squared") / total - 1.0),
        "chi2_seq": float(np.exp(2.0 * seq_log_ratio).mean() - 1.0),
    }


def scale_figures(sums: PartSums, median_rollout_p: float) -> dict[str, float]:
    """What a probability-space figure can see on these tokens, and the log-space figures that see past it.

    |p_train - p_rollout| is at most max(p_train, p_rollout), so `probs_diff_mean_ceiling` (the mean of that
    maximum) is the largest `rollout_probs_diff_mean` these tokens could give, however far the two sides
    disagree: on tokens of probability 0.004 (a random model) it stays far below verl's 0.01. The log-probs
    see the difference at any probability: mean |dlogp|, and `token_multiplicative_error`, mean exp(|dlogp|)
    (NeMo-RL's figure for the same two views of a token). {} without a token. From the tokens' sums and the
    median of their rollout probability.
    """
    if not sums.n:
        return {}
    return {
        "probs_diff_mean_ceiling": sums.ceiling_sum / sums.n,
        "median_rollout_p": median_rollout_p,  # of the tokens themselves (no part's median makes the whole's)
        "mean_abs_dlogp": sums.dlogp_sum / sums.n,
        "max_abs_dlogp": sums.dlogp_max,
        "token_multiplicative_error": sums.multiplicative_sum / sums.n,
    }


def median(values: FloatArray) -> float:
    """`np.median` of finite values, to the bit, at a third of its cost: one selection of the middle value (numpy's
    takes the two middle values and the largest, for its NaN check), then the largest below it where the count is
    even, the two averaged as numpy averages them."""
    size = values.size
    if size == 0:
        return float("nan")
    middle = size // 2
    part = np.partition(values, middle)
    if size % 2:
        return float(part[middle])
    return float((part[:middle].max() + part[middle]) / 2.0)


def per_request(
    rollout: FloatArray, training: FloatArray, mask: BoolArray, responses: IntArray
) -> list[dict[str, Any]]:
    """Per row: tokens, max and mean |dlogp| and |dp|, and the worst token (by |dp|)."""
    return tokens_per_request(Tokens.of(rollout, training, mask, responses))


def tokens_per_request(tokens: Tokens) -> list[dict[str, Any]]:
    """Per row, in row order; the worst token is the row's first of largest |dp|."""
    counts = tokens.counts
    filled = counts > 0
    dp, dlogp = tokens.abs_dp, tokens.abs_dlogp
    sum_dp, sum_dlogp = tokens.row_sums(dp), tokens.row_sums(dlogp)
    max_dp = np.zeros(counts.size)
    max_dlogp = np.zeros(counts.size)
    worst = np.zeros(counts.size, dtype=np.int64)
    if tokens.size:
        max_dp[filled] = tokens.row_max(dp)
        max_dlogp[filled] = tokens.row_max(dlogp)
        hits = np.flatnonzero(dp == max_dp[tokens.row])
        rows_hit, first = np.unique(tokens.row[hits], return_index=True)
        worst[rows_hit] = hits[first]
    ids = tokens.token_ids if tokens.token_ids is not None else np.full(tokens.size, -1, dtype=np.int64)
    columns = zip(
        counts.tolist(),
        max_dlogp.tolist(),
        sum_dlogp.tolist(),
        max_dp.tolist(),
        sum_dp.tolist(),
        tokens.position[worst].tolist() if tokens.size else [0] * counts.size,
        ids[worst].tolist() if tokens.size else [0] * counts.size,
        tokens.rollout[worst].tolist() if tokens.size else [0.0] * counts.size,
        tokens.training[worst].tolist() if tokens.size else [0.0] * counts.size,
        dp[worst].tolist() if tokens.size else [0.0] * counts.size,
    )
    rows: list[dict[str, Any]] = []
    for count, mx_dlogp, s_dlogp, mx_dp, s_dp, position, token_id, r_logp, t_logp, w_dp in columns:
        if count == 0:
            rows.append(
                {
                    "tokens": 0,
                    "max_abs_dlogp": None,
                    "mean_abs_dlogp": None,
                    "max_abs_dp": None,
                    "mean_abs_dp": None,
                    "worst_token": None,
                }
            )
            continue
        rows.append(
            {
                "tokens": count,
                "max_abs_dlogp": mx_dlogp,
                "mean_abs_dlogp": s_dlogp / count,
                "max_abs_dp": mx_dp,
                "mean_abs_dp": s_dp / count,
                "worst_token": {
                    "position": position,
                    "token_id": token_id,
                    "rollout_logp": r_logp,
                    "training_logp": t_logp,
                    "abs_dp": w_dp,
                },
            }
        )
    return rows


class Profiles:
    """|dlogp| and |dp| summed per position in the response and per probability bin, over batches."""

    PROB_EDGES = np.linspace(0.0, 1.0, 11)
    DECADES = 8  # decades 10^-(d+1) <= p < 10^-d for d < 8, then everything below 1e-8

    def __init__(self) -> None:
        self.position_sum_dlogp = np.zeros(0)
        self.position_sum_dp = np.zeros(0)
        self.position_count = np.zeros(0, dtype=np.int64)
        self.prob_sum_dlogp = np.zeros(10)
        self.prob_sum_dp = np.zeros(10)
        self.prob_count = np.zeros(10, dtype=np.int64)
        # per decade of the rollout probability (0.1-1, 0.01-0.1, ..., below 1e-8): where a random or
        # untrained model's tokens (p ~ 1/vocabulary) sit, all in the tenths' first bin
        self.decade_sum_dlogp = np.zeros(self.DECADES + 1)
        self.decade_sum_dp = np.zeros(self.DECADES + 1)
        self.decade_count = np.zeros(self.DECADES + 1, dtype=np.int64)

    def add(self, rollout: FloatArray, training: FloatArray, mask: BoolArray) -> None:
        self.add_tokens(Tokens.of(rollout, training, mask))

    def add_tokens(self, tokens: Tokens) -> None:
        self.add_counts(self.count(tokens))

    @classmethod
    def count(cls, tokens: Tokens) -> dict[str, Any]:
        """One batch's sums and counts, to `add_counts` in the batches' order (each batch's may be taken at the same
        time as another's: a sum over the batches is then still added up in their order)."""
        positions, dlogp, dp = tokens.position, tokens.abs_dlogp, tokens.abs_dp
        length = int(tokens.counts.max()) if tokens.size else 0  # a row of n tokens has positions 0 .. n - 1
        # the tenth each probability falls in (PROB_EDGES[b] <= p < PROB_EDGES[b + 1], p >= 1 in the last):
        # the number of inner edges at or below it (NaN: none)
        p = tokens.p_rollout
        below = np.zeros(p.size, dtype=np.int8)
        for edge in cls.PROB_EDGES[1:-1]:
            below += p >= edge
        bins = below.astype(np.intp)
        # kept as the report has always placed it: a probability too large for `int64(p * 10)` (a log-prob above
        # 41, overflowing to INT64_MIN on x86) in the second tenth; p * 10 >= 2^63 needs p > 9.2e17, so only those
        # are multiplied
        big = np.flatnonzero(p > 9.2e17)
        if big.size:
            bins[big[p[big] * 10.0 >= 2.0**63]] = 1
        # the decade: ceil(-log10 p) - 1 from the log-prob itself (p = 0.1 in the first), p >= 1 in the first,
        # p = 0 in the last
        decade = tokens.rollout * (-1.0 / math.log(10.0))  # one array, each step in place
        np.ceil(decade, out=decade)
        decade -= 1.0
        decades = np.clip(decade, 0, cls.DECADES, out=decade).astype(np.intp)
        size = cls.DECADES + 1
        return {
            "position_sum_dlogp": np.bincount(positions, weights=dlogp, minlength=length),
            "position_sum_dp": np.bincount(positions, weights=dp, minlength=length),
            # the tokens at position k: the rows of more than k tokens
            "position_count": np.bincount(tokens.counts, minlength=length + 1)[::-1].cumsum()[::-1][1 : length + 1],
            "prob_sum_dlogp": np.bincount(bins, weights=dlogp, minlength=10),
            "prob_sum_dp": np.bincount(bins, weights=dp, minlength=10),
            "prob_count": np.bincount(bins, minlength=10),
            "decade_sum_dlogp": np.bincount(decades, weights=dlogp, minlength=size),
            "decade_sum_dp": np.bincount(decades, weights=dp, minlength=size),
            "decade_count": np.bincount(decades, minlength=size),
        }

    def add_counts(self, counts: dict[str, Any]) -> None:
        """`count`'s sums and counts added to these (the positions' grown to the longest response so far)."""
        length = counts["position_count"].size
        if length > self.position_count.size:
            grow = length - self.position_count.size
            self.position_sum_dlogp = np.concatenate([self.position_sum_dlogp, np.zeros(grow)])
            self.position_sum_dp = np.concatenate([self.position_sum_dp, np.zeros(grow)])
            self.position_count = np.concatenate([self.position_count, np.zeros(grow, dtype=np.int64)])
        # a shorter batch's sums go into the first positions (adding its zeros past them changed nothing)
        for name, value in counts.items():
            getattr(self, name)[: value.size] += value

    def by_position(self, buckets: int = 50) -> list[dict[str, Any]]:
        """Mean |dlogp|, |dp| per range of positions (at most `buckets` ranges)."""
        size = self.position_count.size
        if size == 0:
            return []
        width = max(1, math.ceil(size / buckets))
        rows = []
        for start in range(0, size, width):
            stop = min(size, start + width)
            count = int(self.position_count[start:stop].sum())
            if count == 0:
                continue
            rows.append(
                {
                    "first": start,
                    "last": stop - 1,
                    "tokens": count,
                    "mean_abs_dlogp": float(self.position_sum_dlogp[start:stop].sum() / count),
                    "mean_abs_dp": float(self.position_sum_dp[start:stop].sum() / count),
                }
            )
        return rows

    def by_probability(self) -> list[dict[str, Any]]:
        """Per tenth of the rollout's token probability: tokens, mean |dlogp| and |dp|, share of all |dlogp|."""
        total = float(self.prob_sum_dlogp.sum())
        rows = []
        for b in range(10):
            count = int(self.prob_count[b])
            rows.append(
                {
                    "p_from": float(self.PROB_EDGES[b]),
                    "p_to": float(self.PROB_EDGES[b + 1]),
                    "tokens": count,
                    "mean_abs_dlogp": float(self.prob_sum_dlogp[b] / count) if count else None,
                    "mean_abs_dp": float(self.prob_sum_dp[b] / count) if count else None,
                    "share_of_abs_dlogp": float(self.prob_sum_dlogp[b] / total) if total > 0 else None,
                }
            )
        return rows

    def by_probability_decade(self) -> list[dict[str, Any]]:
        """Per decade of the rollout's token probability (the last: below 1e-8): tokens, mean |dlogp| and |dp|."""
        rows = []
        for d in range(self.DECADES + 1):
            count = int(self.decade_count[d])
            rows.append(
                {
                    "p_from": 0.0 if d == self.DECADES else 10.0 ** -(d + 1),
                    "p_to": 10.0**-d,
                    "tokens": count,
                    "mean_abs_dlogp": float(self.decade_sum_dlogp[d] / count) if count else None,
                    "mean_abs_dp": float(self.decade_sum_dp[d] / count) if count else None,
                }
            )
        return rows


def dlogp_histogram(abs_dlogp: FloatArray, bins: int = 50, parts: list[slice] | None = None) -> dict[str, Any]:
    """|dlogp| counted in `bins` logarithmic bins between its smallest and largest positive value.

    `identical` counts the tokens where both sides agree exactly (no place on a log axis). With `parts` (each
    step's tokens), `parts` holds each one's counts and identical tokens over the same bins: each part is
    counted by `np.histogram` over the run's range, whose bin of a value depends on the value alone, so the
    run's counts are the parts' summed, and equal to one histogram of every token.
    """
    positive = abs_dlogp > 0
    identical = int(abs_dlogp.size - np.count_nonzero(positive))
    if identical == abs_dlogp.size:
        empty = [{"counts": [], "identical": int(part.stop - part.start)} for part in parts or []]
        return {"edges": [], "counts": [], "identical": identical} | ({"parts": empty} if parts is not None else {})
    values = abs_dlogp[positive] if identical else abs_dlogp
    low, high = max(float(values.min()), 1e-300), float(values.max())
    if high <= low:
        high = low * 1.0001
    span = (math.log10(low), math.log10(high))
    if parts is None:
        counts, edges = np.histogram(np.log10(values, out=values if identical else None), bins=bins, range=span)
        return {"edges": (10.0**edges).tolist(), "counts": counts.tolist(), "identical": identical}
    total = np.zeros(bins, dtype=np.int64)
    each = []
    for part in parts:
        mine = abs_dlogp[part]
        kept = mine[mine > 0]
        counts, edges = np.histogram(np.log10(kept, out=kept), bins=bins, range=span)
        total += counts
        each.append({"counts": counts.tolist(), "identical": int(mine.size - kept.size)})
    edges = np.histogram_bin_edges(np.zeros(0), bins=bins, range=span)
    return {"edges": (10.0**edges).tolist(), "counts": total.tolist(), "identical": identical, "parts": each}
