"""`report`'s numbers against plain-Python computations of the same definitions (no numpy in the oracle)."""

from __future__ import annotations

import itertools
import json
import math
import statistics

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlprobe_patch.report.metrics import Profiles, debug_metrics, dlogp_histogram, offpolicy_metrics, per_request


def _batch(seed: int, lengths: list[int], width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    training = np.log(rng.uniform(0.001, 1.0, (len(lengths), width)))
    rollout = training + rng.normal(0.0, 0.2, training.shape)
    mask = np.zeros(training.shape, dtype=bool)
    for i, n in enumerate(lengths):
        mask[i, :n] = True
    responses = rng.integers(0, 50_000, training.shape)
    return rollout, training, mask, responses


def _tokens(rollout, training, mask):
    return [
        (i, j, float(rollout[i, j]), float(training[i, j]))
        for i in range(mask.shape[0])
        for j in range(mask.shape[1])
        if mask[i, j]
    ]


@pytest.mark.parametrize("lengths", [[7, 3, 9, 1], [9, 0, 4], [1], [2, 0]])
def test_debug_metrics_follow_the_definitions(lengths: list[int]) -> None:
    rollout, training, mask, _ = _batch(len(lengths), lengths, 9)
    got = debug_metrics(rollout, training, mask)
    tokens = _tokens(rollout, training, mask)
    diffs = [abs(math.exp(t) - math.exp(r)) for _, _, r, t in tokens]
    assert got["training/rollout_probs_diff_valid"] == 1
    assert got["training/rollout_probs_diff_max"] == pytest.approx(max(diffs))
    assert got["training/rollout_probs_diff_mean"] == pytest.approx(statistics.fmean(diffs))
    if len(diffs) > 1:
        assert got["training/rollout_probs_diff_std"] == pytest.approx(statistics.stdev(diffs))
        corr = statistics.correlation([math.exp(t) for *_, t in tokens], [math.exp(r) for _, _, r, _ in tokens])
        assert got["training/rollout_actor_probs_pearson_corr"] == pytest.approx(corr)
    else:
        assert math.isnan(got["training/rollout_probs_diff_std"])


def test_no_token_is_invalid() -> None:
    rollout, training, mask, _ = _batch(0, [0, 0], 4)
    got = debug_metrics(rollout, training, mask)
    assert got["training/rollout_probs_diff_valid"] == 0
    assert math.isnan(got["training/rollout_probs_diff_max"])
    assert offpolicy_metrics(training, rollout, mask) == {}


@pytest.mark.parametrize("lengths", [[7, 3, 9, 1], [9, 0, 4], [1]])
def test_offpolicy_metrics_follow_the_definitions(lengths: list[int]) -> None:
    rollout, training, mask, _ = _batch(10 + len(lengths), lengths, 9)
    got = offpolicy_metrics(training, rollout, mask)
    import ctypes

    def eps_count(n: int) -> float:  # verl's count + 1e-8, in float32
        return ctypes.c_float(ctypes.c_float(n).value + ctypes.c_float(1e-8).value).value

    rows = [
        [(float(rollout[i, j]), float(training[i, j])) for j in range(9) if mask[i, j]] for i in range(len(lengths))
    ]
    mean_t = [sum(t for _, t in row) / eps_count(len(row)) for row in rows]
    mean_r = [sum(r for r, _ in row) / eps_count(len(row)) for row in rows]
    flat = [pair for row in rows for pair in row]
    count = eps_count(len(flat))
    diff = [a - b for a, b in zip(mean_r, mean_t)]
    assert got["training_ppl"] == pytest.approx(statistics.fmean(math.exp(-m) for m in mean_t))
    assert got["rollout_ppl"] == pytest.approx(statistics.fmean(math.exp(-m) for m in mean_r))
    assert got["kl"] == pytest.approx(sum(r - t for r, t in flat) / count)
    assert got["k3_kl"] == pytest.approx(sum(math.exp(t - r) - (t - r) - 1 for r, t in flat) / count)
    assert got["log_ppl_diff"] == pytest.approx(statistics.fmean(diff))
    assert got["log_ppl_abs_diff"] == pytest.approx(statistics.fmean(abs(d) for d in diff))
    assert (got["log_ppl_diff_max"], got["log_ppl_diff_min"]) == pytest.approx((max(diff), min(diff)))
    assert got["ppl_ratio"] == pytest.approx(statistics.fmean(math.exp(d) for d in diff))
    clamp = lambda x: max(-20.0, min(20.0, x))  # noqa: E731
    assert got["chi2_token"] == pytest.approx(sum(math.exp(clamp(t - r)) ** 2 for r, t in flat) / count - 1)
    seq = [math.exp(2 * clamp(sum(t - r for r, t in row))) for row in rows]
    assert got["chi2_seq"] == pytest.approx(statistics.fmean(seq) - 1)


def test_per_request_and_worst_token() -> None:
    rollout, training, mask, responses = _batch(3, [5, 0, 8], 8)
    rows = per_request(rollout, training, mask, responses)
    assert rows[1]["tokens"] == 0 and rows[1]["worst_token"] is None
    for i in (0, 2):
        valid = [j for j in range(8) if mask[i, j]]
        dps = {j: abs(math.exp(training[i, j]) - math.exp(rollout[i, j])) for j in valid}
        worst = max(dps, key=dps.__getitem__)
        assert rows[i]["worst_token"]["position"] == valid.index(worst)
        assert rows[i]["worst_token"]["token_id"] == responses[i, worst]
        assert rows[i]["max_abs_dp"] == pytest.approx(dps[worst])
        assert rows[i]["mean_abs_dlogp"] == pytest.approx(
            statistics.fmean(abs(training[i, j] - rollout[i, j]) for j in valid)
        )


def test_profiles_by_position_and_probability() -> None:
    profiles = Profiles()
    batches = [_batch(5, [6, 2, 4], 6), _batch(6, [9, 9], 9)]
    for rollout, training, mask, _ in batches:
        profiles.add(rollout, training, mask)
    tokens = [t for rollout, training, mask, _ in batches for t in _tokens(rollout, training, mask)]
    by_position = {r["first"]: r for r in profiles.by_position(buckets=100)}
    for position in range(9):
        at = [abs(t - r) for i, j, r, t in tokens if j == position]
        assert by_position[position]["tokens"] == len(at)
        assert by_position[position]["mean_abs_dlogp"] == pytest.approx(statistics.fmean(at))
    by_probability = profiles.by_probability()
    assert sum(r["tokens"] for r in by_probability) == len(tokens)
    for row in by_probability:
        inside = [abs(t - r) for *_, r, t in tokens if row["p_from"] <= math.exp(r) < row["p_to"] or
                  (row["p_to"] == 1.0 and math.exp(r) >= 1.0)]  # fmt: skip
        assert row["tokens"] == len(inside)
    assert sum(r["share_of_abs_dlogp"] for r in by_probability if r["tokens"]) == pytest.approx(1.0)
    # by decade (issue 35, item 8: a random model's tokens all fall in the first tenth), the last below 1e-8
    by_decade = profiles.by_probability_decade()
    assert sum(r["tokens"] for r in by_decade) == len(tokens)
    for row in by_decade:
        inside = [abs(t - r) for *_, r, t in tokens if row["p_from"] <= math.exp(r) < row["p_to"] or
                  (row["p_to"] == 1.0 and math.exp(r) >= 1.0)]  # fmt: skip
        assert row["tokens"] == len(inside), row
        assert row["mean_abs_dlogp"] == (pytest.approx(statistics.fmean(inside)) if inside else None)


def test_worst_token_with_holes_and_a_row_that_agrees() -> None:
    """A mask with holes (tool tokens left out) and a row whose tokens all agree: positions count valid tokens."""
    rollout, training, _, responses = _batch(9, [6, 6], 6)
    mask = np.array([[False, True, False, True, True, False], [False, False, True, True, False, False]])
    training[1] = rollout[1]  # every valid token of row 1 agrees
    rows = per_request(rollout, training, mask, responses)
    dps = {j: abs(math.exp(training[0, j]) - math.exp(rollout[0, j])) for j in (1, 3, 4)}
    worst = max(dps, key=dps.__getitem__)
    assert rows[0]["worst_token"]["position"] == [1, 3, 4].index(worst)
    assert rows[0]["worst_token"]["token_id"] == responses[0, worst]
    assert rows[1]["max_abs_dp"] == 0.0
    assert rows[1]["worst_token"]["position"] == 0 and rows[1]["worst_token"]["token_id"] == responses[1, 2]


def test_run_figures_from_the_steps_equal_the_stacked_batch() -> None:
    """The run's figures equal the same figures on one stacked batch, and each part of the run (views of
    its arrays) gives exactly the figures of its batch alone."""
    from rlprobe_patch.report.metrics import (
        Tokens,
        tokens_debug_metrics,
        tokens_offpolicy_metrics,
        tokens_per_request,
    )

    a, b = _batch(1, [5, 0, 8], 8), _batch(2, [3, 3], 4)
    joined = Tokens.join([a, b])
    parts = list(joined.parts())
    for part, batch in zip(parts, (a, b)):
        alone = Tokens.of(*batch)
        assert part.size == alone.size and np.shares_memory(part.training, joined.training)
        assert tokens_debug_metrics(part) == tokens_debug_metrics(alone)
        assert tokens_offpolicy_metrics(part) == tokens_offpolicy_metrics(alone)
        assert tokens_per_request(part) == tokens_per_request(alone)
        assert np.shares_memory(part.abs_dp, joined.abs_dp)  # computed once, over the run
    stacked = [np.zeros((5, 8)), np.zeros((5, 8)), np.zeros((5, 8), dtype=bool)]
    for i, (r, t, m, _) in enumerate((a, b)):
        rows = slice(0, 3) if i == 0 else slice(3, 5)
        stacked[0][rows, : r.shape[1]], stacked[1][rows, : t.shape[1]], stacked[2][rows, : m.shape[1]] = r, t, m
    assert tokens_debug_metrics(joined) == pytest.approx(debug_metrics(*stacked))
    assert tokens_offpolicy_metrics(joined) == pytest.approx(offpolicy_metrics(stacked[1], stacked[0], stacked[2]))


def test_histogram_parts_sum_to_the_runs_histogram() -> None:
    """Issue 42, item 8 (the page tells the steps apart): each step's |dlogp| counts over the run's bins, which add
    up to one histogram of every token, bin by bin; identical tokens (0) counted apart, per step too."""
    rng = np.random.default_rng(7)
    values = np.abs(rng.normal(0.0, 1.0, 5000)) ** 6  # many decades, so values fall on and near bin edges
    values[::97] = 0.0
    ends = [0, 1200, 1200, 4100, 5000]  # an empty step among them
    parts = [slice(a, b) for a, b in itertools.pairwise(ends)]
    before = values.copy()
    whole = dlogp_histogram(values.copy())
    split = dlogp_histogram(values, parts=parts)
    assert split["edges"] == whole["edges"] and split["counts"] == whole["counts"]
    assert split["identical"] == whole["identical"] == 52
    assert [sum(p["counts"]) + p["identical"] for p in split["parts"]] == [1200, 0, 2900, 900]
    assert np.array_equal(np.sum([p["counts"] for p in split["parts"]], axis=0), whole["counts"])
    assert np.array_equal(values, before)  # the run's array is left as it was (no log taken in place)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.floats(min_value=-50.0, max_value=1e300, allow_nan=False), min_size=1, max_size=60),
    st.booleans(),
)
def test_median_is_numpys_to_the_bit(values: list[float], ties: bool) -> None:
    """Issue 45: the report's median of a step's (and the run's) probabilities, one selection where np.median makes
    three, is np.median's value exactly, at odd and even counts, with ties and infinities."""
    from rlprobe_patch.report.metrics import median

    array = np.array(values + values[: len(values) // 2] if ties else values)
    assert median(array) == float(np.median(array))
    both = np.array([-np.inf, np.inf])
    with np.errstate(invalid="ignore"):  # -inf + inf: nan, as it is meant to be here
        assert np.isnan(median(both)) and np.isnan(np.median(both))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=6), st.integers(0, 2**32 - 1))
def test_run_figures_combined_from_the_steps_are_numpys_over_the_run(sizes: list[int], seed: int) -> None:
    """Issue 45: the run's mean, std, Pearson correlation, maxima and means of the scale figures are combined from
    the steps' sums (no pass over the run's tokens): numpy's over every token to 1e-12 of their size, and one
    step's are numpy's own to the bit."""
    from rlprobe_patch.report.metrics import PartSums, Tokens, debug_figures

    rng = np.random.default_rng(seed)
    batches = []
    for size in sizes:
        mask = np.ones((1, size), dtype=bool)
        training = np.log(rng.uniform(1e-6, 1.0, (1, size)))
        batches.append((training + rng.normal(0.0, 0.05, (1, size)), training, mask, None))
    run = Tokens.join(batches)
    combined = debug_figures(PartSums.combine([PartSums.of(part) for part in run.parts()]))
    dp, a, b = run.abs_dp, run.p_train, run.p_rollout
    if run.size == 0:
        assert combined["training/rollout_probs_diff_valid"] == 0
        return
    expected = {
        "training/rollout_probs_diff_valid": 1,
        "training/rollout_probs_diff_max": float(dp.max()),
        "training/rollout_probs_diff_mean": float(dp.mean()),
        "training/rollout_probs_diff_std": float(dp.std(ddof=1)) if dp.size > 1 else float("nan"),
        "training/rollout_actor_probs_pearson_corr": float(np.corrcoef(a, b)[0, 1]) if dp.size > 1 else float("nan"),
    }
    for key, value in expected.items():
        assert combined[key] == pytest.approx(value, rel=1e-12, abs=1e-300, nan_ok=True), key
    alone = debug_figures(PartSums.of(run))
    assert alone["training/rollout_probs_diff_mean"] == float(dp.mean())
    if dp.size > 1:
        assert alone["training/rollout_probs_diff_std"] == float(dp.std(ddof=1))


def test_requests_encoded_in_a_thread_are_the_documents_text() -> None:
    """Issue 45: report.json's requests are encoded in a thread while the diagnosis runs (`EncodedList`); the text,
    laid out and on one line, is what the same document with a plain list gives, NaN and infinities included."""
    from concurrent.futures import ThreadPoolExecutor

    from rlprobe_patch.report import EncodedList, encode, json_text, to_json

    requests = [
        {"request_id": f"r{i}", "max_abs_dp": i / 7, "worst_token": {"position": i, "rollout_logp": -i / 3}}
        for i in range(50)
    ]
    requests[3]["max_abs_dp"] = float("nan")
    requests[4]["worst_token"]["rollout_logp"] = float("-inf")
    plain = {"format": "rlprobe-report", "tokens": {"tokens": 50, "requests": requests}}
    with ThreadPoolExecutor(max_workers=1) as pool:
        texts = pool.submit(lambda: [json_text(request) for request in requests]).result()
    threaded = {"format": "rlprobe-report", "tokens": {"tokens": 50, "requests": EncodedList(requests, texts)}}
    text, line = encode(threaded)
    assert (text, line) == encode(plain)
    assert json.loads(line) == json.loads(json.dumps(to_json(plain)))
    assert json.loads(line)["tokens"]["requests"][3]["max_abs_dp"] is None
    assert text.count("\n") == 50 + 8  # a request a line, and the 8 lines around them


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.integers(min_value=0, max_value=30), min_size=1, max_size=4), min_size=1, max_size=5),
       st.integers(0, 2**32 - 1))  # fmt: skip
def test_run_offpolicy_figures_from_the_steps_are_the_runs(rows: list[list[int]], seed: int) -> None:
    """Issue 45: verl's off-policy figures of a run, from its steps' own tokens (`parts_offpolicy_metrics`: the rows'
    figures over every step's rows, the tokens' sums the steps' added exactly rounded), are those over the run's
    tokens laid end to end: to the bit for the rows' figures, to 1e-12 for the tokens' sums; one step's, its own."""
    from rlprobe_patch.report.metrics import Tokens, parts_offpolicy_metrics, tokens_offpolicy_metrics

    rng = np.random.default_rng(seed)
    batches = []
    for lengths in rows:
        width = max(lengths) or 1
        mask = np.arange(width)[None, :] < np.array(lengths)[:, None]
        training = np.log(rng.uniform(1e-6, 1.0, mask.shape))
        rollout = training + rng.normal(0.0, 0.05, mask.shape)
        rollout[0, :1] += 25.0  # past verl's clamp, where a row has a token
        batches.append((rollout, training, mask, None))
    steps = [Tokens.of(*batch) for batch in batches]
    got, run = parts_offpolicy_metrics(steps), tokens_offpolicy_metrics(Tokens.join(batches))
    assert got.keys() == run.keys()
    for key, value in run.items():
        assert got[key] == pytest.approx(value, rel=1e-12, abs=1e-15), key
    for key in ("training_ppl", "rollout_ppl", "log_ppl_diff_max", "log_ppl_diff_min", "chi2_seq"):
        assert got.get(key) == run.get(key)  # the rows' figures: the same rows, the same order
    assert parts_offpolicy_metrics(steps[:1]) == tokens_offpolicy_metrics(Tokens.of(*batches[0]))


def test_forgotten_values_are_made_again_alike() -> None:
    """`Tokens.forget` frees a step's per-token and per-row arrays but those kept, keeps every figure `memo` made, and
    a value read after it is made again, equal to the first."""
    from rlprobe_patch.report.metrics import Tokens, tokens_offpolicy_metrics

    tokens = Tokens.of(*_batch(3, [5, 0, 8], 8)[:3])
    before = {name: getattr(tokens, name).copy() for name in ("abs_dp", "abs_dlogp", "p_rollout", "position")}
    figures = tokens_offpolicy_metrics(tokens)
    made = tokens.memo("figure", lambda: 1.5)
    tokens.forget("abs_dlogp")
    arrays = {name for name, value in tokens._cache.items() if isinstance(value, np.ndarray)}
    assert arrays == {"abs_dlogp", "starts", "row_sum_training", "row_sum_rollout", "row_sum_log_ratio"}
    assert ("sum", "k3_terms") in tokens._cache and tokens.memo("figure", lambda: 0.0) == made
    for name, value in before.items():
        assert np.array_equal(getattr(tokens, name), value)
    assert tokens_offpolicy_metrics(tokens) == figures


def test_step_tokens_groups_consecutive_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """`step_tokens` lays consecutive steps end to end until a group holds `GROUP_TOKENS` tokens (the last group what
    is left); each step a view of its group's arrays, its tokens those it has alone."""
    from rlprobe_patch.report import build as report_build
    from rlprobe_patch.report.capture_format import TokenBatch
    from rlprobe_patch.report.metrics import Tokens

    lengths = [[5, 0, 8], [3, 3], [7], [2, 2, 2], [4]]  # 13, 6, 7, 6, 4 tokens
    batches = []
    for seed, rows in enumerate(lengths):
        rollout, training, mask, responses = _batch(seed, rows, 8)
        batches.append(TokenBatch("x", "verl-capture", seed, [f"r{i}" for i in range(len(rows))],
                                  np.zeros(len(rows), dtype=np.int64), responses, mask, rollout, training))  # fmt: skip
    monkeypatch.setattr(report_build, "GROUP_TOKENS", 12)
    parts = report_build.step_tokens(batches)
    groups = [
        [i for i, part in enumerate(parts) if part.whole is whole]
        for whole in {id(p.whole): p.whole for p in parts}.values()
    ]
    assert groups == [[0], [1, 2], [3, 4]]  # 13; 6 + 7; 6 + 4, the last
    for part, batch in zip(parts, batches):
        alone = Tokens.of(batch.rollout, batch.training, batch.mask, batch.responses)
        assert np.array_equal(part.training, alone.training) and np.array_equal(part.token_ids, alone.token_ids)
        assert np.shares_memory(part.training, part.whole.training)
