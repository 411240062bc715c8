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
builds once per batch and concatenates for the run: every figure is then a vectorised reduction
(`np.bincount`, `np.maximum.reduceat`) over about as many numbers as there are response tokens,
never over the padding, and no Python loop runs per token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

_EPS = 1e-8  # verl's masked_mean adds it to the count
_SAFETY_BOUND = 20.0  # verl's clamp of log-ratios in the chi-squared estimates


@dataclass
class Tokens:
    """The valid tokens of a batch (or of several), row after row, and what every figure derives from them."""

    training: FloatArray
    rollout: FloatArray
    counts: IntArray  # valid tokens per row (0 for an empty response)
    token_ids: IntArray | None = None
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def of(
        cls, rollout: FloatArray, training: FloatArray, mask: BoolArray, responses: IntArray | None = None
    ) -> Tokens:
        return cls(
            training=training[mask],
            rollout=rollout[mask],
            counts=mask.sum(axis=1).astype(np.int64),
            token_ids=responses[mask] if responses is not None else None,
        )

    @classmethod
    def concat(cls, parts: list[Tokens]) -> Tokens:
        """The parts one after the other; per-token values every part has computed are joined, not redone."""
        ids = [p.token_ids for p in parts if p.token_ids is not None]
        joined = cls(
            training=np.concatenate([p.training for p in parts]) if parts else np.zeros(0),
            rollout=np.concatenate([p.rollout for p in parts]) if parts else np.zeros(0),
            counts=np.concatenate([p.counts for p in parts]) if parts else np.zeros(0, dtype=np.int64),
            token_ids=np.concatenate(ids) if parts and len(ids) == len(parts) else None,
        )
        for name in ("p_train", "p_rollout", "abs_dp", "abs_dlogp"):
            if parts and all(name in p._cache for p in parts):
                joined._cache[name] = np.concatenate([p._cache[name] for p in parts])
        return joined

    def _get(self, name: str) -> Any:
        if name not in self._cache:
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
        return np.abs(self.p_train - self.p_rollout)

    def _make_abs_dlogp(self) -> FloatArray:
        return np.abs(self.training - self.rollout)

    def _make_row(self) -> IntArray:
        return np.repeat(np.arange(self.counts.size, dtype=np.int64), self.counts)

    def _make_starts(self) -> IntArray:
        return np.concatenate([[0], np.cumsum(self.counts)[:-1]]).astype(np.int64)

    def _make_position(self) -> IntArray:
        return np.arange(self.size, dtype=np.int64) - self.starts[self.row]

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
    if not tokens.size:
        nan = float("nan")
        return {
            "training/rollout_probs_diff_valid": 0,
            "training/rollout_probs_diff_max": nan,
            "training/rollout_probs_diff_mean": nan,
            "training/rollout_probs_diff_std": nan,
            "training/rollout_actor_probs_pearson_corr": nan,
        }
    diff = tokens.abs_dp
    return {
        "training/rollout_probs_diff_valid": 1,
        "training/rollout_probs_diff_max": float(diff.max()),
        "training/rollout_probs_diff_mean": float(diff.mean()),
        "training/rollout_probs_diff_std": float(diff.std(ddof=1)) if diff.size > 1 else float("nan"),
        "training/rollout_actor_probs_pearson_corr": _pearson(tokens.p_train, tokens.p_rollout),
    }


def _pearson(a: FloatArray, b: FloatArray) -> float:
    if a.size < 2:
        return float("nan")
    da, db = a - a.mean(), b - b.mean()
    # products summed, not np.dot: a BLAS call wakes its thread pool, slower than the sum itself here
    denominator = math.sqrt(float((da * da).sum()) * float((db * db).sum()))
    if denominator == 0.0:
        return float("nan")
    return max(-1.0, min(1.0, float((da * db).sum()) / denominator))


def _eps_count(count: Any) -> Any:
    # verl adds the epsilon to the mask's sum in float32 (its masks are bool, int or float32 tensors):
    # 1e-8 is kept for an empty row, lost on a count of 1 or more
    return (np.asarray(count, dtype=np.float32) + np.float32(_EPS)).astype(np.float64)


def offpolicy_metrics(training: FloatArray, rollout: FloatArray, mask: BoolArray) -> dict[str, float]:
    """verl's off-policy diagnostics (without verl's `rollout_corr/` prefix); {} without a token."""
    return tokens_offpolicy_metrics(Tokens.of(rollout, training, mask))


def tokens_offpolicy_metrics(tokens: Tokens) -> dict[str, float]:
    if not tokens.size:
        return {}
    count = _eps_count(tokens.counts)
    total = _eps_count(tokens.size)
    mean_train = tokens.row_sums(tokens.training) / count
    mean_rollout = tokens.row_sums(tokens.rollout) / count
    log_ratio = tokens.training - tokens.rollout
    log_ppl_diff = mean_rollout - mean_train
    rho = np.exp(np.clip(log_ratio, -_SAFETY_BOUND, _SAFETY_BOUND))
    seq_log_ratio = np.clip(tokens.row_sums(log_ratio), -_SAFETY_BOUND, _SAFETY_BOUND)
    return {
        "training_ppl": float(np.exp(-mean_train).mean()),
        "training_log_ppl": float((-mean_train).mean()),
        "kl": float(-log_ratio.sum() / total),
        "k3_kl": float((np.exp(log_ratio) - log_ratio - 1.0).sum() / total),
        "rollout_ppl": float(np.exp(-mean_rollout).mean()),
        "rollout_log_ppl": float((-mean_rollout).mean()),
        "log_ppl_diff": float(log_ppl_diff.mean()),
        "log_ppl_abs_diff": float(np.abs(log_ppl_diff).mean()),
        "log_ppl_diff_max": float(log_ppl_diff.max()),
        "log_ppl_diff_min": float(log_ppl_diff.min()),
        "ppl_ratio": float(np.exp(log_ppl_diff).mean()),
        "chi2_token": float((rho * rho).sum() / total - 1.0),
        "chi2_seq": float(np.exp(2.0 * seq_log_ratio).mean() - 1.0),
    }


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

    def __init__(self) -> None:
        self.position_sum_dlogp = np.zeros(0)
        self.position_sum_dp = np.zeros(0)
        self.position_count = np.zeros(0, dtype=np.int64)
        self.prob_sum_dlogp = np.zeros(10)
        self.prob_sum_dp = np.zeros(10)
        self.prob_count = np.zeros(10, dtype=np.int64)

    def add(self, rollout: FloatArray, training: FloatArray, mask: BoolArray) -> None:
        self.add_tokens(Tokens.of(rollout, training, mask))

    def add_tokens(self, tokens: Tokens) -> None:
        positions, dlogp, dp = tokens.position, tokens.abs_dlogp, tokens.abs_dp
        length = int(positions.max()) + 1 if positions.size else 0
        if length > self.position_count.size:
            grow = length - self.position_count.size
            self.position_sum_dlogp = np.concatenate([self.position_sum_dlogp, np.zeros(grow)])
            self.position_sum_dp = np.concatenate([self.position_sum_dp, np.zeros(grow)])
            self.position_count = np.concatenate([self.position_count, np.zeros(grow, dtype=np.int64)])
        size = self.position_count.size
        self.position_sum_dlogp += np.bincount(positions, weights=dlogp, minlength=size)
        self.position_sum_dp += np.bincount(positions, weights=dp, minlength=size)
        self.position_count += np.bincount(positions, minlength=size)
        # the tenth each probability falls in (PROB_EDGES[b] <= p < PROB_EDGES[b + 1], p >= 1 in the last):
        # p * 10 rounded down, then moved by one where that rounding and the edges disagree
        p = tokens.p_rollout
        bins = np.clip((p * 10.0).astype(np.int64), 0, 9)
        bins -= (p < self.PROB_EDGES[bins]) & (bins > 0)
        bins += (p >= self.PROB_EDGES[bins + 1]) & (bins < 9)
        self.prob_sum_dlogp += np.bincount(bins, weights=dlogp, minlength=10)
        self.prob_sum_dp += np.bincount(bins, weights=dp, minlength=10)
        self.prob_count += np.bincount(bins, minlength=10)

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


def dlogp_histogram(abs_dlogp: FloatArray, bins: int = 50) -> dict[str, Any]:
    """|dlogp| counted in `bins` logarithmic bins between its smallest and largest positive value.

    `identical` counts the tokens where both sides agree exactly (no place on a log axis).
    """
    positive = abs_dlogp[abs_dlogp > 0]
    identical = int(abs_dlogp.size - positive.size)
    if not positive.size:
        return {"edges": [], "counts": [], "identical": identical}
    low, high = max(float(positive.min()), 1e-300), float(positive.max())
    if high <= low:
        high = low * 1.0001
    counts, edges = np.histogram(np.log10(positive), bins=bins, range=(math.log10(low), math.log10(high)))
    return {"edges": (10.0**edges).tolist(), "counts": counts.tolist(), "identical": identical}
