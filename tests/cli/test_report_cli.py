"""`rlprobe-patch report` on captures written by `write_capture`: outputs, thresholds, replay, bad input."""

from __future__ import annotations

import json
import math
import shutil
import zipfile
from pathlib import Path
from xml.etree import ElementTree

import numpy as np
import pytest
from conftest import WORKFLOW_SCRIPTS, cli, cli_json
from printed import definitions, printed_commands, printed_other

from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.report.capture_format import FORMAT, read_capture, write_capture
from rlprobe_patch.report.layers import read_compare_csv


def _write(folder: Path, step: int, *, bad_row: int | None = None, seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed + step)
    n, width = 5, 12
    lengths = [12, 4, 0, 1, 9]
    mask = np.zeros((n, width), dtype=bool)
    for i, k in enumerate(lengths):
        mask[i, :k] = True
    training = np.log(rng.uniform(0.05, 1.0, (n, width)))
    rollout = training + rng.normal(0.0, 1e-3, (n, width))
    if bad_row is not None:
        rollout[bad_row, 2] = training[bad_row, 2] - 2.0  # one token the rollout found far less likely
    responses = rng.integers(0, 1000, (n, width))
    keep = np.array([True, True, True, True, True])
    write_capture(
        folder,
        step=step,
        request_ids=[f"req-{step}-{i}" for i in range(n)],
        prompt_lengths=np.full(n, 6),
        responses=responses,
        response_mask=mask,
        rollout_log_probs=rollout,
        old_log_probs=training,
        dataset_index=np.arange(n) + 100 * step,
        raw_prompts=[json.dumps([{"role": "user", "content": f"q{step}-{i}"}]) for i in range(n)],
        keep=keep,
    )
    return rollout, training, mask, responses


def test_capture_round_trip_drops_padding_rows(tmp_path: Path) -> None:
    mask = np.array([[1, 1, 0], [0, 0, 0], [1, 0, 0]], dtype=bool)
    lp = np.log(np.full((3, 3), 0.5))
    path = write_capture(tmp_path, step=7, request_ids=["a", "", "c"], prompt_lengths=[3, 0, 2],
                         responses=np.arange(9).reshape(3, 3), response_mask=mask, rollout_log_probs=lp,
                         old_log_probs=lp, keep=[True, False, True])  # fmt: skip
    batch = read_capture(Path(path))
    assert Path(path).name == "step-000007.rlprobe-logprobs.npz"
    assert batch.request_ids == ["a", "c"] and batch.step == 7
    assert batch.mask.sum(axis=1).tolist() == [2, 1]
    assert batch.responses[1, 0] == 6
    assert not list(tmp_path.glob(".*"))  # no temporary file left


def test_report_ranks_the_bad_request_and_gates(tmp_path: Path) -> None:
    _write(tmp_path / "cap", 1)
    rollout, training, _mask, responses = _write(tmp_path / "cap", 2, bad_row=4)
    code, out = cli_json("report", tmp_path / "cap", "-o", tmp_path / "out", "--top", "2", "--max-prob-diff", "0.05")
    assert code == ExitCode.VERIFY_FAILED
    tokens = out["tokens"]
    assert tokens["samples"] == 10 and tokens["empty_responses"] == 2
    assert tokens["tokens"] == 2 * (12 + 4 + 1 + 9)
    worst = tokens["requests"][0]
    assert worst["request_id"] == "req-2-4" and worst["rank"] == 1
    assert worst["worst_token"] == {
        "position": 2,
        "token_id": int(responses[4, 2]),
        "rollout_logp": pytest.approx(float(rollout[4, 2])),
        "training_logp": pytest.approx(float(training[4, 2])),
        "abs_dp": pytest.approx(abs(math.exp(training[4, 2]) - math.exp(rollout[4, 2]))),
    }
    (check,) = out["thresholds"]
    assert check["crossed"] is True and check["value"] == pytest.approx(worst["max_abs_dp"])
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert saved["tokens"]["requests"][0]["request_id"] == "req-2-4"
    html = (tmp_path / "out" / "report.html").read_text()
    assert "req-2-4" in html and html.count("<svg ") == 3  # inline: histogram, by position, by probability
    # the histogram's title counts what report.json holds; its text is text (searchable, checked by the browser)
    marker = 'id="plot-histogram"'
    svg = ElementTree.fromstring(html[html.index(marker) :].split(">", 1)[1].split("<figcaption>", 1)[0])
    texts = " ".join(t.text or "" for t in svg.iter("{http://www.w3.org/2000/svg}text"))
    histogram = saved["tokens"]["abs_dlogp_histogram"]
    assert f"|dlogp| of {tokens['tokens']} tokens ({histogram['identical']} identical" in texts
    assert sum(histogram["counts"]) + histogram["identical"] == tokens["tokens"]
    replay = [json.loads(line) for line in (tmp_path / "out" / "replay_prompts.jsonl").read_text().splitlines()]
    assert [r["extra_info"]["request_id"] for r in replay] == [r["request_id"] for r in tokens["requests"][:2]]
    assert replay[0]["prompt"] == [{"role": "user", "content": "q2-4"}] and replay[0]["extra_info"]["index"] == 204
    assert "--mode consistency" in out["replay"]["command"]
    # within a looser limit: exit 0; the text summary names the worst request
    result = cli("report", tmp_path / "cap", "-o", tmp_path / "out2", "--max-prob-diff", "0.9")
    assert result.exit_code == ExitCode.OK, result.output
    assert "#1 req-2-4" in result.output and "report:" in result.output


def test_replay_takes_the_runs_own_rows_by_dataset_index(tmp_path: Path) -> None:
    _write(tmp_path / "cap", 3, bad_row=0)
    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"own {i}", "extra_info": {"index": 300 + i}}) + "\n" for i in range(5))
    )
    code, _out = cli_json("report", tmp_path / "cap", "-o", tmp_path / "out", "--top", "1", "--data", data)
    assert code == ExitCode.VERIFY_FAILED  # the bad row: diff_mean above verl's 0.01, the default verdict
    rows = (tmp_path / "out" / "replay_prompts.jsonl").read_text().splitlines()
    assert json.loads(rows[0]) == {"prompt": "own 0", "extra_info": {"index": 300}}


@pytest.mark.parametrize("damage", ["truncated", "foreign", "no-rollout", "text"])
def test_bad_capture_names_the_file_and_writes_nothing(tmp_path: Path, damage: str) -> None:
    folder = tmp_path / "cap"
    _write(folder, 1)
    good = next(folder.glob("*.npz"))
    bad = folder / "step-000002.rlprobe-logprobs.npz"
    if damage == "truncated":
        bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    elif damage == "foreign":
        np.savez(bad, weights=np.zeros(3))
    elif damage == "no-rollout":
        with np.load(good) as archive:
            arrays = {k: archive[k] for k in archive.files if k != "rollout_log_probs"}
        np.savez(bad, **arrays)
    else:
        bad.write_text("step,logp\n1,-0.5\n")
    code, out = cli_json("report", folder, "-o", tmp_path / "out")
    assert code == ExitCode.REFUSED
    assert str(bad) in out["message"]
    if damage == "no-rollout":
        assert "no rollout_log_probs" in out["message"]
    if damage == "foreign":
        assert FORMAT in out["message"]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("side", "value"), [("rollout", -np.inf), ("training", np.nan), ("rollout", np.inf)])
def test_non_finite_log_probs_are_named_not_a_crash(tmp_path: Path, side: str, value: float) -> None:
    # a padding position may hold anything; a response token's NaN / inf is named, file, request and token
    folder = tmp_path / "cap"
    rollout, training, mask, responses = _write(folder, 1)
    rollout[2, 5] = training[2, 5] = np.nan  # row 2 has no response token: padding, ignored
    (rollout if side == "rollout" else training)[4, 3] = value
    path = write_capture(folder, step=1, request_ids=[f"req-1-{i}" for i in range(5)], prompt_lengths=np.full(5, 6),
                         responses=responses, response_mask=mask, rollout_log_probs=rollout,
                         old_log_probs=training)  # fmt: skip
    code, out = cli_json("report", folder, "-o", tmp_path / "out")
    assert code == ExitCode.REFUSED, out
    assert out["message"].startswith(f"{path}: 1 {side} log-prob(s) of response tokens are NaN or infinite")
    assert f"request req-1-4, response token 3 (id {responses[4, 3]}) = {value}" in out["message"]
    assert not (tmp_path / "out").exists()


def test_compare_csv_of_another_msprobe_version(tmp_path: Path) -> None:
    # the columns of msprobe releases before requires_grad was compared (no "NPU Requires_grad")
    old = tmp_path / "000_req-0" / "compare_result_1.csv"
    old.parent.mkdir()
    old.write_text(
        "NPU Name,Bench Name,NPU Dtype,Bench Dtype,NPU Tensor Shape,Bench Tensor Shape,Cosine,MaxAbsErr,"
        "MaxRelativeErr,Accuracy Reached or Not,Err_message\n"
        "Module.a.Linear.forward.0.output.0,Module.a.Linear.forward.0.output.0,torch.float32,torch.float32,"
        "[2],[2],1.0,0.0,0.0,Yes,\n"
    )
    code, out = cli_json("report", tmp_path, "-o", tmp_path / "out")
    assert code == ExitCode.REFUSED
    assert str(old) in out["message"] and "another version" in out["message"]
    with pytest.raises(Exception, match="another version"):
        read_compare_csv(old)


def test_nothing_to_report(tmp_path: Path) -> None:
    code, out = cli_json("report", tmp_path)
    assert code == ExitCode.REFUSED and "nothing to report" in out["message"]
    (tmp_path / "x.txt").write_text("hi")
    code, out = cli_json("report", tmp_path / "x.txt")
    assert code == ExitCode.REFUSED and "x.txt" in out["message"]


def test_zip_that_is_not_npz(tmp_path: Path) -> None:
    path = tmp_path / "step-000001.rlprobe-logprobs.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("readme.txt", "hello")
    code, out = cli_json("report", path, "-o", tmp_path / "out")
    assert code == ExitCode.REFUSED and str(path) in out["message"]


# The real demo's capture and compare CSVs (tests/data/README.md): vLLM's log-probs against verl's on a random
# tiny Qwen2, step 1 with the same weights, step 2 with one weight's sign flipped on the rollout side.
DEMO = Path(__file__).resolve().parents[1] / "data" / "demo-consistency-vllm"


def test_replay_on_the_demos_capture_says_why_no_prompt_is_written(tmp_path: Path) -> None:
    """Issue 35, item 5: the demo's capture carries no prompt text and no dataset index; the report says so
    and what to pass, instead of writing nothing in silence."""
    script = tmp_path / "run.sh"
    shutil.copy(WORKFLOW_SCRIPTS / "grpo_fsdp_vllm.sh", script)
    args = ["report", DEMO / "capture", "-o", tmp_path / "out", "--top", "2", "--replay-script", script]
    result = cli(*args)
    assert not (tmp_path / "out" / "replay_prompts.jsonl").exists()
    said = " ".join(result.output.split())
    assert "replay_prompts.jsonl not written" in said
    assert "no prompt text (raw_prompts) and no dataset index" in said and "--data" in said
    replay = json.loads((tmp_path / "out" / "report.json").read_text())["replay"]
    assert replay["prompts"] is None and len(replay["without_prompt"]) == 2
    assert "no prompt text" in replay["why_not"]
    # --data cannot help a capture without dataset indexes: said, not ignored
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"prompt": [{"role": "user", "content": "hi"}]}) + "\n")
    result = cli(*args, "--data", data)
    assert "no dataset index" in " ".join(result.output.split()) and str(data) in result.output


def test_replay_says_which_requests_have_no_row(tmp_path: Path) -> None:
    """Rows written for the requests that have a prompt; the others named, with why."""
    _write(tmp_path / "cap", 3, bad_row=0)
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"prompt": "own 0", "extra_info": {"index": 300}}) + "\n")
    with np.load(next((tmp_path / "cap").glob("*.npz"))) as archive:
        arrays = {k: archive[k] for k in archive.files if k != "raw_prompts"}
    np.savez(next((tmp_path / "cap").glob("*.npz")), **arrays)  # the dataset index alone
    code, out = cli_json("report", tmp_path / "cap", "-o", tmp_path / "out", "--top", "2", "--data", data)
    assert code == ExitCode.VERIFY_FAILED  # the bad row, by verl's guidance
    rows = (tmp_path / "out" / "replay_prompts.jsonl").read_text().splitlines()
    assert [json.loads(r) for r in rows] == [{"prompt": "own 0", "extra_info": {"index": 300}}]
    (missing,) = out["replay"]["without_prompt"]
    assert "not in --data" in out["replay"]["why_not"] and missing in out["replay"]["why_not"]


@pytest.mark.parametrize(("dp", "state", "code"), [(0.003, "ok", 0), (0.007, "warn", 0), (0.02, "fail", 4)])
def test_without_a_threshold_verls_guidance_decides(tmp_path: Path, dp: float, state: str, code: int) -> None:
    """Issue 35, item 6: no threshold option, verl's own levels (0.005 warn, 0.01 fail, from verl's FAQ), per step."""
    mask = np.ones((4, 8), dtype=bool)
    training = np.log(np.full(mask.shape, 0.5))
    write_capture(tmp_path / "cap", step=1, request_ids=list("abcd"), prompt_lengths=[3] * 4,
                  responses=np.zeros(mask.shape), response_mask=mask, old_log_probs=training,
                  rollout_log_probs=np.log(0.5 + np.full(mask.shape, dp)))  # fmt: skip
    result = cli("report", tmp_path / "cap", "-o", tmp_path / "out")
    assert result.exit_code == code, result.output
    assert f"verdict: {state.upper()} (by verl's FAQ (docs/faq/faq.rst" in result.output
    out = json.loads((tmp_path / "out" / "report.json").read_text())
    (step,) = out["verdict"]["steps"]
    assert (step["state"], step["informative"], out["verdict"]["state"]) == (state, True, state)
    assert (out["verdict"]["warn"], out["verdict"]["fail"]) == (0.005, 0.01)
    if state == "ok":  # the steps within are counted in one line, not listed (a run has thousands)
        assert out["verdict"]["reasons"] == [
            "1 step(s) within verl's 0.005 (largest rollout_probs_diff_mean 0.003, step 1)"
        ]
    # an explicit threshold overrides: it decides the exit code, the verdict is still shown
    result = cli("report", tmp_path / "cap", "-o", tmp_path / "out", "--max-prob-diff-mean", "0.5")
    assert result.exit_code == 0 and "the threshold options given decide the exit code" in result.output


def test_the_demos_tiny_probabilities_are_graded_on_log_probs(tmp_path: Path) -> None:
    """Issue 35, item 6, on the real demo: a random model's tokens have p ~ 0.004, so the flipped weight's
    rollout_probs_diff_mean stays far below 0.01; the verdict says the number is uninformative there and fails
    the step on its log-probs, and on the layer compare."""
    code, out = cli_json("report", DEMO / "capture", "-o", tmp_path / "out")
    assert code == ExitCode.VERIFY_FAILED
    same, flipped = out["verdict"]["steps"]
    assert (same["step"], same["state"], flipped["step"], flipped["state"]) == (1, "ok", 2, "fail")
    assert flipped["value"] < 0.005 and flipped["probs_diff_mean_ceiling"] < 0.01 and not flipped["informative"]
    assert flipped["token_multiplicative_error"] > 1.05 > same["token_multiplicative_error"]
    assert "uninformative here" in flipped["why"] and "NeMo-RL" in flipped["why"]
    result = cli("report", DEMO / "capture", DEMO / "compare", "-o", tmp_path / "both")
    said = " ".join(result.output.split())
    assert "verdict: FAIL" in said and "uninformative here" in said
    assert "4 of 8 pair(s) leave the layer floor" in said and "layers.1.mlp.down_proj" in said


def test_diagnosis_on_the_real_demo_names_the_broken_layer(tmp_path: Path) -> None:
    """Issue 36, first part: the real capture and compare, with step 1 (the same weights) as the noise floor:
    the diagnosis ranks the broken layer first, with the confirming `script --set` line, in report.json, the
    summary and the page; without a floor it says none was measured."""
    args = ["report", DEMO / "capture", DEMO / "compare", "-o", tmp_path / "out", "--floor-step", "1"]
    code, out = cli_json(*args)
    assert code == ExitCode.VERIFY_FAILED
    diagnosis = out["diagnosis"]
    assert diagnosis["top"] == "broken-layer" and diagnosis["floor"]["measured"]
    assert [s["causes"][0]["cause"] for s in diagnosis["steps"]] == ["precision-noise", "broken-layer"]
    said = cli(*args).output
    assert "diagnosis (noise floor measured): measured on step 1 of the inputs" in said
    assert "1. broken-layer (1.00)" in said
    # issue 42: without the run's launch script there is no run to name (no YOUR_TRAINING_SCRIPT.sh line); the
    # report says how to get them, the placeholder defined where it is printed
    assert "confirm:" not in said and "YOUR_TRAINING_SCRIPT" not in said
    assert "next: confirm broken-layer: " in said and "(where RUN.sh is the run's launch script" in said
    page = (tmp_path / "out" / "report.html").read_text()
    assert "id='diagnosis'" in page and "id='noise-floor'" in page
    said = cli("report", DEMO / "capture", "-o", tmp_path / "none").output
    assert "diagnosis (noise floor not measured): no noise floor measured" in said


def test_baseline_capture_is_the_floor(tmp_path: Path) -> None:
    """`--baseline`: the real step-1 capture (the same computation on both sides) as the floor; the input is a
    transformation of it, not the real chain: its rollout log-probs shifted by log 0.7, as a temperature
    applied on one side only leaves them."""
    base = DEMO / "capture" / "step-000001.rlprobe-logprobs.npz"
    same = read_capture(base)
    write_capture(tmp_path / "cap", step=3, request_ids=same.request_ids, prompt_lengths=same.prompt_lengths,
                  responses=same.responses, response_mask=same.mask, old_log_probs=same.training,
                  rollout_log_probs=same.rollout + math.log(0.7))  # fmt: skip
    code, out = cli_json("report", tmp_path / "cap", "-o", tmp_path / "out", "--baseline", base)
    assert code == ExitCode.VERIFY_FAILED
    assert out["diagnosis"]["top"] == "logprob-kind" and str(base) in out["diagnosis"]["floor"]["how"]
    assert "a constant offset 0.357 = log 1.43" in out["diagnosis"]["causes"][0]["evidence"]  # 1.43 = 1 / 0.7
    code, out = cli_json("report", tmp_path / "cap", "-o", tmp_path / "out", "--floor-step", "9")
    assert code == ExitCode.REFUSED and "--floor-step 9: no such step" in out["message"]
    code, out = cli_json("report", tmp_path / "cap", "-o", tmp_path / "o", "--floor-step", "3", "--baseline", base)
    assert code == ExitCode.REFUSED and "give one" in out["message"]


def test_diagnosis_of_a_capture_without_response_tokens(tmp_path: Path) -> None:
    """Only empty responses: the diagnosis says there is nothing to diagnose, and ranks nothing."""
    mask = np.zeros((2, 3), dtype=bool)
    zeros = np.zeros(mask.shape)
    write_capture(tmp_path / "cap", step=1, request_ids=["a", "b"], prompt_lengths=[1, 1], responses=zeros,
                  response_mask=mask, rollout_log_probs=zeros, old_log_probs=zeros)  # fmt: skip
    result = cli("report", tmp_path / "cap", "-o", tmp_path / "out")
    assert result.exit_code == ExitCode.OK and "no response token: nothing to diagnose" in result.output
    diagnosis = json.loads((tmp_path / "out" / "report.json").read_text())["diagnosis"]
    assert diagnosis["causes"] == [] and diagnosis["top"] is None and diagnosis["steps"] == []


def test_replay_script_gives_the_diagnosis_the_runs_sampling(tmp_path: Path) -> None:
    """`--replay-script`: the launch script's rollout temperature and logprobs_mode, read as bash and Hydra would,
    go with the logprob-kind evidence (the capture: the real step 1 with a planted log 0.7 offset)."""
    same = read_capture(DEMO / "capture" / "step-000001.rlprobe-logprobs.npz")
    write_capture(tmp_path / "cap", step=3, request_ids=same.request_ids, prompt_lengths=same.prompt_lengths,
                  responses=same.responses, response_mask=same.mask, old_log_probs=same.training,
                  rollout_log_probs=same.rollout + math.log(0.7))  # fmt: skip
    script = tmp_path / "run.sh"
    script.write_text(
        "python3 -m verl.trainer.main_ppo actor_rollout_ref.rollout.name=vllm \\\n"
        "    actor_rollout_ref.rollout.temperature=0.7 \\\n"
        "    actor_rollout_ref.rollout.logprobs_mode=raw_logprobs trainer.total_epochs=1\n"
    )
    base = DEMO / "capture" / "step-000001.rlprobe-logprobs.npz"
    code, out = cli_json(
        "report", tmp_path / "cap", "-o", tmp_path / "out", "--baseline", base, "--replay-script", script
    )
    assert code == ExitCode.VERIFY_FAILED
    diagnosis = out["diagnosis"]
    assert diagnosis["sampling"] == {"source": str(script), "temperature": 0.7, "logprobs_mode": "raw_logprobs"}
    # raw log-probs (at T 1) against a trainer at the run's T 0.7: a temperature mismatch by the settings, whose
    # slope (1 / 0.7 - 1) the planted constant offset does not show: the fit alone decides
    assert diagnosis["top"] == "logprob-kind"
    assert "log-probs at temperature 1 against 0.7" in diagnosis["causes"][0]["evidence"]
    # each a run of this script with one setting changed, as printed: both differ from what the script sets
    confirms = diagnosis["causes"][0]["confirm"]
    assert [line.split("  # ")[0] for line in confirms] == [
        f"rlprobe-patch script {script} --mode consistency --set actor_rollout_ref.rollout.logprobs_mode="
        f"processed_logprobs -o {tmp_path / 'run.confirm-logprobs_mode.sh'}",
        f"rlprobe-patch script {script} --mode consistency --set actor_rollout_ref.rollout.temperature=1.0 "
        f"-o {tmp_path / 'run.confirm-temperature.sh'}",
    ]


# --- issue 42: the report's inputs and outputs, as a user met them on the demo's real outputs -----------------


def _demo_compare_with_views(tmp_path: Path, files: int = 1000) -> Path:
    """The demo's compare folder as check-dump --compare leaves it: each run's pairs, and beside them
    `<run>.actor-views/<pair>/` with a dump.json and msprobe's tensor files (`dump_tensor_data/*.pt`; the real
    demo's held 832; empty stand-ins here, never to be read)."""
    compare = tmp_path / "compare"
    shutil.copytree(DEMO / "compare", compare)
    for run in ("generate", "generate-perturbed"):
        for pair in sorted(p.name for p in (compare / run).iterdir()):
            tensors = compare / f"{run}.actor-views" / pair / "dump_tensor_data"
            tensors.mkdir(parents=True)
            (tensors.parent / "dump.json").write_text('{"data": {}}')
            for i in range(files // 8):
                (tensors / f"Module.model.layers.{i}.mlp.down_proj.Linear.forward.0.output.0.pt").write_bytes(b"")
    return compare


def test_msprobe_tensor_files_beside_the_compare_are_not_slime_dumps(tmp_path: Path) -> None:
    """Item 3: `report caps compare` on the demo's compare folder had taken the actor views' 832 msprobe tensor
    files for slime dumps and failed, "Argument list too long" (exit 3)."""
    compare = _demo_compare_with_views(tmp_path)
    code, out = cli_json("report", DEMO / "capture", compare, "-o", tmp_path / "out")
    assert code == ExitCode.VERIFY_FAILED and out["ok"] is False, out  # the verdict FAIL, not a refusal
    assert out["inputs"]["slime"] == [] and len(out["inputs"]["compare"]) == 8
    assert out["layers"]["first_common_divergence"] == "Module.model.layers.1.mlp.down_proj.Linear.forward.0"


def test_a_stray_torch_file_in_a_capture_folder_is_left_out_with_a_note(tmp_path: Path) -> None:
    """Item 3: a `.pt` that is no slime dump, found in a folder given, had failed the whole report; it is left out,
    said in a note (named as a file, it is still refused)."""
    captures = tmp_path / "caps"
    shutil.copytree(DEMO / "capture", captures)
    stray = captures / "notes.pt"
    stray.write_bytes(b"not a torch file")
    result = cli("report", captures, "-o", tmp_path / "out")
    assert result.exit_code == ExitCode.VERIFY_FAILED, result.output
    said = " ".join(result.output.split())
    # read in a Python with torch: not a slime dump; without torch (this one): not readable; left out either way
    assert f"note: {stray}: left out" in said or f"not read: cannot read slime's debug dumps ({stray})" in said, said
    code, out = cli_json("report", captures, stray, "-o", tmp_path / "out2")
    assert code == ExitCode.REFUSED and str(stray) in out["message"], out


def test_an_input_given_twice_is_read_once(tmp_path: Path) -> None:
    """Item 6: a folder and a file in it had been counted twice, silently."""
    step = DEMO / "capture" / "step-000001.rlprobe-logprobs.npz"
    _, once = cli_json("report", DEMO / "capture", "-o", tmp_path / "a")
    _, twice = cli_json("report", DEMO / "capture", step, "-o", tmp_path / "b")
    assert twice["tokens"]["tokens"] == once["tokens"]["tokens"] == 48
    assert twice["inputs"]["captures"] == once["inputs"]["captures"]


@pytest.mark.parametrize("option", ["--baseline", "--replay-script", "--data"])
def test_a_missing_path_option_is_refused_like_a_missing_input(tmp_path: Path, option: str) -> None:
    """Item 6: `--baseline /missing` had exited 2 where a missing input exits 3; `--replay-script /missing` was
    taken silently."""
    missing = tmp_path / "missing"
    code, out = cli_json("report", DEMO / "capture", "-o", tmp_path / "out", option, missing)
    assert code == ExitCode.REFUSED and out["ok"] is False and f"{option} {missing}" in out["message"], out
    code, out = cli_json("report", missing, "-o", tmp_path / "out")
    assert code == ExitCode.REFUSED and str(missing) in out["message"]


def test_a_broken_pair_json_is_said(tmp_path: Path) -> None:
    """Item 6: a pair.json cut short had been ignored silently; the report names it in a note (the pair is
    headed by its folder alone)."""
    compare = tmp_path / "compare"
    shutil.copytree(DEMO / "compare", compare)
    broken = next(compare.rglob("pair.json"))
    broken.write_text(broken.read_text()[:40])
    result = cli("report", DEMO / "capture", compare, "-o", tmp_path / "out")
    assert result.exit_code == ExitCode.VERIFY_FAILED, result.output
    assert f"note: {broken}: not readable as check-dump's JSON" in " ".join(result.output.split())


def test_report_json_has_ok(tmp_path: Path) -> None:
    """Item 6: `report --json` had no `ok` on success (the README promises it): ok is the exit code's."""
    code, out = cli_json("report", DEMO / "capture", "-o", tmp_path / "out", "--max-prob-diff-mean", "0.01")
    assert code == ExitCode.OK and out["ok"] is True and next(iter(out)) == "ok"
    code, out = cli_json("report", DEMO / "capture", "-o", tmp_path / "out")
    assert code == ExitCode.VERIFY_FAILED and out["ok"] is False


def test_an_unwritable_output_folder_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 6: an -o folder that cannot be written had been refused naming our temporary file beside report.json."""
    import tempfile

    def refuse(*args: object, dir: object = None, **kwargs: object) -> object:
        raise PermissionError(13, "Permission denied", f"{dir}/.report.json.x1y2.rlprobe-tmp")

    out_dir = tmp_path / "out"
    out_dir.mkdir()
    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    code, out = cli_json("report", DEMO / "capture", "-o", out_dir)
    assert code == ExitCode.REFUSED and out["message"].startswith(f"{out_dir / 'report.json'}: Permission denied")
    assert "rlprobe-tmp" not in json.dumps(out)


def test_next_names_the_csv_to_read_not_a_command_that_fails(tmp_path: Path) -> None:
    """Item 4: `open <csv>` (macOS only) had been printed as the next step; the CSV is named as a file to read,
    every other next line is an rlprobe-patch command or the training run, each placeholder defined on it."""
    result = cli("report", DEMO / "capture", DEMO / "compare", "-o", tmp_path / "out", "--floor-step", "1")
    assert "open " not in result.output
    others = printed_other(result.output)
    csv_lines = [line for line in others if line.endswith(".csv")]
    assert len(csv_lines) == 1 and Path(csv_lines[0]).is_file(), others
    assert all(line in csv_lines or " bash " in line for line in others), others
    for command in printed_commands(result.output):
        used = {w.split("/")[0] for w in command if w.isupper() or w.split("/")[0].isupper()}
        assert used <= definitions(result.output), (command, definitions(result.output))


def test_values_of_the_capture_are_escaped_on_the_page_and_plain_in_the_summary(tmp_path: Path) -> None:
    """Request ids and prompts come from the run's capture (anyone's): the page's template escapes every value
    on its way in (autoescape), so a request id that looks like markup is text on the page; the summary prints it
    as it is."""
    planted = "<img src=x onerror=alert(1)>&\"'"
    mask = np.ones((2, 4), dtype=bool)
    lp = np.log(np.full((2, 4), 0.5))
    write_capture(tmp_path / "cap", step=1, request_ids=[planted, "plain"], prompt_lengths=[3, 3],
                  responses=np.arange(8).reshape(2, 4), response_mask=mask, rollout_log_probs=lp - 0.1,
                  old_log_probs=lp)  # fmt: skip
    result = cli("report", tmp_path / "cap", "-o", tmp_path / "out")
    page = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    assert planted not in page and "<img" not in page
    assert '<span title="&lt;img src=x onerror=alert(1)&gt;&amp;&quot;&#x27;">' in page
    assert f" {planted} (step 1): max |dp|" in result.stdout
