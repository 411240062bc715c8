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
The inputs are padded (N, R) arrays and a boolean mask, as in a capture.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

_EPS = 1e-8  # verl's masked_mean adds it to the count
_SAFETY_BOUND = 20.0  # verl's clamp of log-ratios in the chi-squared estimates


def debug_metrics(rollout: FloatArray, training: FloatArray, mask: BoolArray) -> dict[str, float]:
    """`training/rollout_probs_diff_*` and `training/rollout_actor_probs_pearson_corr`."""
    if not mask.any():
        nan = float("nan")
        return {
            "training/rollout_probs_diff_valid": 0,
            "training/rollout_probs_diff_max": nan,
            "training/rollout_probs_diff_mean": nan,
            "training/rollout_probs_diff_std": nan,
            "training/rollout_actor_probs_pearson_corr": nan,
        }
    p_train = np.exp(training[mask])
    p_rollout = np.exp(rollout[mask])
    diff = np.abs(p_train - p_rollout)
    return {
        "training/rollout_probs_diff_valid": 1,
        "training/rollout_probs_diff_max": float(diff.max()),
        "training/rollout_probs_diff_mean": float(diff.mean()),
        "training/rollout_probs_diff_std": float(diff.std(ddof=1)) if diff.size > 1 else float("nan"),
        "training/rollout_actor_probs_pearson_corr": _pearson(p_train, p_rollout),
    }


def _pearson(a: FloatArray, b: FloatArray) -> float:
    if a.size < 2:
        return float("nan")
    da, db = a - a.mean(), b - b.mean()
    denominator = math.sqrt(float((da * da).sum()) * float((db * db).sum()))
    if denominator == 0.0:
        return float("nan")
    return max(-1.0, min(1.0, float((da * db).sum()) / denominator))


def _masked_mean(values: FloatArray, mask: BoolArray, axis: int | None = None) -> Any:
    total = np.where(mask, values, 0.0).sum(axis=axis)
    # verl adds the epsilon to the mask's sum in float32 (its masks are bool, int or float32 tensors):
    # 1e-8 is kept for an empty row, lost on a count of 1 or more
    count = np.asarray(mask.sum(axis=axis), dtype=np.float32) + np.float32(_EPS)
    return total / count.astype(np.float64)


def offpolicy_metrics(training: FloatArray, rollout: FloatArray, mask: BoolArray) -> dict[str, float]:
    """verl's off-policy diagnostics (without verl's `rollout_corr/` prefix); {} without a token."""
    if not mask.any():
        return {}
    mean_train = _masked_mean(training, mask, axis=-1)
    mean_rollout = _masked_mean(rollout, mask, axis=-1)
    log_ratio = np.where(mask, training - rollout, 0.0)
    log_ppl_diff = mean_rollout - mean_train
    rho = np.exp(np.clip(log_ratio, -_SAFETY_BOUND, _SAFETY_BOUND))
    seq_log_ratio = np.clip(log_ratio.sum(axis=-1), -_SAFETY_BOUND, _SAFETY_BOUND)
    return {
        "training_ppl": float(np.exp(-mean_train).mean()),
        "training_log_ppl": float((-mean_train).mean()),
        "kl": float(_masked_mean(rollout - training, mask)),
        "k3_kl": float(_masked_mean(np.exp(log_ratio) - log_ratio - 1.0, mask)),
        "rollout_ppl": float(np.exp(-mean_rollout).mean()),
        "rollout_log_ppl": float((-mean_rollout).mean()),
        "log_ppl_diff": float(log_ppl_diff.mean()),
        "log_ppl_abs_diff": float(np.abs(log_ppl_diff).mean()),
        "log_ppl_diff_max": float(log_ppl_diff.max()),
        "log_ppl_diff_min": float(log_ppl_diff.min()),
        "ppl_ratio": float(np.exp(log_ppl_diff).mean()),
        "chi2_token": float(_masked_mean(rho * rho, mask) - 1.0),
        "chi2_seq": float(np.exp(2.0 * seq_log_ratio).mean() - 1.0),
    }


def per_request(
    rollout: FloatArray, training: FloatArray, mask: BoolArray, responses: npt.NDArray[np.int64]
) -> list[dict[str, Any]]:
    """Per row: tokens, max and mean |dlogp| and |dp|, and the worst token (by |dp|)."""
    dlogp = np.where(mask, np.abs(training - rollout), 0.0)
    dp = np.where(mask, np.abs(np.exp(training) - np.exp(rollout)), 0.0)
    counts = mask.sum(axis=1)
    worst = dp.argmax(axis=1) if dp.shape[1] else np.zeros(len(counts), dtype=np.int64)
    positions = np.cumsum(mask, axis=1) - 1  # a token's position among the row's valid tokens
    rows: list[dict[str, Any]] = []
    for i, count in enumerate(counts.tolist()):
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
        w = int(worst[i])
        rows.append(
            {
                "tokens": count,
                "max_abs_dlogp": float(dlogp[i].max()),
                "mean_abs_dlogp": float(dlogp[i].sum() / count),
                "max_abs_dp": float(dp[i].max()),
                "mean_abs_dp": float(dp[i].sum() / count),
                "worst_token": {
                    "position": int(positions[i, w]),
                    "token_id": int(responses[i, w]),
                    "rollout_logp": float(rollout[i, w]),
                    "training_logp": float(training[i, w]),
                    "abs_dp": float(dp[i, w]),
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
        self.histogram_dlogp: list[FloatArray] = []

    def add(self, rollout: FloatArray, training: FloatArray, mask: BoolArray) -> None:
        positions = (np.cumsum(mask, axis=1) - 1)[mask]
        dlogp = np.abs(training - rollout)[mask]
        p_rollout = np.exp(rollout[mask])
        dp = np.abs(np.exp(training[mask]) - p_rollout)
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
        bins = np.clip(np.digitize(p_rollout, self.PROB_EDGES[1:-1]), 0, 9)
        self.prob_sum_dlogp += np.bincount(bins, weights=dlogp, minlength=10)
        self.prob_sum_dp += np.bincount(bins, weights=dp, minlength=10)
        self.prob_count += np.bincount(bins, minlength=10)
        self.histogram_dlogp.append(dlogp)

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

    def all_dlogp(self) -> FloatArray:
        return np.concatenate(self.histogram_dlogp) if self.histogram_dlogp else np.zeros(0)
