"""`rlprobe-patch script` / `check-script`: exactly the skill's overrides, in a new file; refusals.

On real releases' configs: tests/real/test_workflow_script_real.py.
"""

from __future__ import annotations

import difflib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import CONFIG_FILES, CONFIGS, cli, cli_json, msprobe_configs
from printed import printed_commands
from script_oracle import SHARED

from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.base.fsio import sha256
from rlprobe_patch.launch.script import read_script

CONSISTENCY_FSDP = {
    "data.train_batch_size": 1,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 1,
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 1,
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 1,
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 1,
    "actor_rollout_ref.rollout.agent.num_workers": 1,
    "actor_rollout_ref.model.use_remove_padding": True,
    "actor_rollout_ref.actor.use_dynamic_bsz": False,
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz": False,
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz": False,
    "trainer.balance_batch": False,
    "trainer.val_before_train": False,
    "trainer.total_training_steps": 1,
    "algorithm.rollout_correction.rollout_is": None,
    "algorithm.rollout_correction.rollout_rs": None,
    "algorithm.rollout_correction.rollout_rs_threshold": None,
    "algorithm.rollout_correction.rollout_is_batch_normalize": False,
    "actor_rollout_ref.rollout.n": 8,
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": 1,
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size": 1,
    "actor_rollout_ref.rollout.enforce_eager": True,
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 8,
    "actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.dump_config_path": CONFIGS[3],
    # vLLM: one request per prefill pass, the whole prompt (issue 35, item 2); chunked prefill off needs
    # max_num_batched_tokens (8192) >= max_model_len: the script's prompt + response lengths
    "actor_rollout_ref.rollout.max_num_seqs": 1,
    "actor_rollout_ref.rollout.enable_prefix_caching": False,
    "actor_rollout_ref.rollout.enable_chunked_prefill": False,
    "actor_rollout_ref.rollout.max_model_len": 512 + 1024,
}


def only_insertions(before: str, after: str) -> bool:
    """`after` is `before` with text inserted, nothing removed or replaced."""
    ops = difflib.SequenceMatcher(None, before, after, autojunk=False).get_opcodes()
    return all(tag in ("equal", "insert") for tag, *_ in ops)


def test_consistency_script_has_exactly_the_overrides(workflow_scripts: Path) -> None:
    original = workflow_scripts / "grpo_fsdp_vllm.sh"
    before = sha256(original.read_bytes())
    out_path = workflow_scripts / "run_consistency.sh"
    configs = msprobe_configs(workflow_scripts / "configs")[:4]
    code, out = cli_json("script", str(original), "--mode", "consistency", *configs, "-o", str(out_path))
    assert code == ExitCode.OK, out
    assert sha256(original.read_bytes()) == before  # never edited
    assert subprocess.run(["bash", "-n", str(out_path)]).returncode == 0

    old, new = read_script(original), read_script(out_path)
    changed = {k for k in new.settings if k not in old.settings or new.settings[k].value != old.settings[k].value}
    assert changed == set(CONSISTENCY_FSDP) - {
        "actor_rollout_ref.model.use_remove_padding"
    }  # that one was already True
    dump_key = "actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.dump_config_path"
    for key, value in {**CONSISTENCY_FSDP, dump_key: configs[3]}.items():
        assert new.value(key, "missing") == value, key
    assert set(old.settings) - set(new.settings) == set()  # nothing dropped
    assert {k: v.value for k, v in new.env.items() if k not in old.env} == {
        "TORCHDYNAMO_DISABLE": "1",
        "DUMP_ON": "1",
        "PROMPTS_ONLY": "1",
        "DUMP_PHASE": "log_prob",
        "MSPROBE_ACTOR_CONFIG": configs[1],
    }
    # the user's override stays where it was; ours comes after it on the same launch, so Hydra takes ours
    first, ours = new.overrides_of("data.train_batch_size")
    assert (first.value, ours.value) == (old.value("data.train_batch_size"), 1)
    assert new.settings["data.train_batch_size"].source == ours.source
    assert any("forced to 1" in n for n in out["notices"])
    actions = {c["key"]: c["action"] for c in out["changes"]}
    assert actions["data.train_batch_size"] == "set" and actions["trainer.total_training_steps"] == "added"
    assert only_insertions(original.read_text(), out_path.read_text())  # nothing of the user's edited

    code, out = cli_json("check-script", str(out_path), "--mode", "consistency")
    assert code == ExitCode.OK, [c for c in out["checks"] if not c["ok"]]
    code, out = cli_json("check-script", str(original), "--mode", "consistency")
    assert code == ExitCode.VERIFY_FAILED
    failed = {c["name"] for c in out["checks"] if not c["ok"]}
    assert "data.train_batch_size=1" in failed and "export DUMP_ON=1" in failed
    assert "rollout dump config" in failed


def test_existing_output_and_original_are_protected(workflow_scripts: Path) -> None:
    original = workflow_scripts / "grpo_fsdp_vllm.sh"
    code, out = cli_json("script", str(original), "--mode", "consistency", *CONFIGS, "-o", str(original))
    assert code == ExitCode.REFUSED and "original" in out["message"]
    target = workflow_scripts / "exists.sh"
    target.write_text("keep me\n")
    code, out = cli_json("script", str(original), "--mode", "consistency", *CONFIGS, "-o", str(target))
    assert code == ExitCode.REFUSED and target.read_text() == "keep me\n"
    code, _ = cli_json("script", str(original), "--mode", "consistency", *CONFIGS, "-o", str(target), "--force")
    assert code == ExitCode.OK and "rlprobe-patch" in target.read_text()


@pytest.mark.parametrize(
    ("name", "args", "reason"),
    [
        ("fsdp_tp_mismatch.sh", (), "FSDP: rollout TP must equal the rollout GPU count"),
        ("megatron_misaligned.sh", (), "Megatron: TP must be equal on actor, ref and rollout"),
        ("megatron_misaligned.sh", (), "Megatron: pipeline parallelism must be 1 for the dump"),
        ("megatron_misaligned.sh", (), "Megatron: PP must be equal"),
        ("grpo_fsdp_vllm.sh", ("--rollout-backend", "sglang", "--sglang-version", "0.5.4"), None),
    ],
)
def test_misaligned_inputs_are_refused(
    workflow_scripts: Path, name: str, args: tuple[str, ...], reason: str | None
) -> None:
    out_path = workflow_scripts / "out.sh"
    code, out = cli_json(
        "script", str(workflow_scripts / name), "--mode", "consistency", *CONFIGS, *args, "-o", str(out_path)
    )
    if reason is None:  # SGLang < 0.5.11: no dump argument, a notice about the ModelRunner patch
        assert code == ExitCode.OK
        assert any("ModelRunner" in n for n in out["notices"])
        assert "msprobe_dump_config" not in out_path.read_text()
        return
    assert code == ExitCode.REFUSED, out
    assert any(reason in d for d in out["details"]), out["details"]
    assert not out_path.exists()


def test_vllm_rollout_pipeline_parallel_is_refused(workflow_scripts: Path) -> None:
    script = workflow_scripts / "pp.sh"
    script.write_text(
        (workflow_scripts / "megatron_aligned.sh")
        .read_text()
        .replace(
            "trainer.n_gpus_per_node=8",
            "actor_rollout_ref.rollout.pipeline_model_parallel_size=2 trainer.n_gpus_per_node=8",
        )
    )
    code, out = cli_json("script", str(script), "--mode", "consistency", *CONFIGS, "-o", str(workflow_scripts / "o.sh"))
    assert code == ExitCode.REFUSED
    assert any("vLLM rollout with pipeline parallelism > 1 is unsupported" in d for d in out["details"])


def test_megatron_aligned_sets_dp_and_pp(workflow_scripts: Path) -> None:
    out_path = workflow_scripts / "out.sh"
    code, out = cli_json(
        "script", str(workflow_scripts / "megatron_aligned.sh"), "--mode", "consistency", *CONFIGS, "-o", str(out_path)
    )
    assert code == ExitCode.OK, out
    new = read_script(out_path)
    assert new.value("actor_rollout_ref.rollout.n") == 4  # 8 GPUs / TP 2
    assert new.value("actor_rollout_ref.actor.megatron.pipeline_model_parallel_size") == 1
    assert new.value("actor_rollout_ref.ref.megatron.pipeline_model_parallel_size") == 1
    assert new.value("actor_rollout_ref.actor.ulysses_sequence_parallel_size", "unset") == "unset"  # FSDP only


def test_release_specific_dump_arguments(workflow_scripts: Path) -> None:
    out_path = workflow_scripts / "out.sh"
    base = (
        "script",
        str(workflow_scripts / "grpo_fsdp_vllm.sh"),
        "--mode",
        "inference",
        "--generate-config",
        CONFIGS[3],
    )
    code, _ = cli_json(*base, "--vllm-ascend-version", "0.12.0", "-o", str(out_path))
    assert code == ExitCode.OK
    assert read_script(out_path).value("vllm.additional_config.dump_config") == CONFIGS[3]
    code, _ = cli_json(*base, "--vllm-ascend-version", "0.18.0", "-o", str(out_path), "--force")
    assert read_script(out_path).value("vllm.additional_config.dump_config_path") == CONFIGS[3]
    code, _ = cli_json(
        *base, "--rollout-backend", "sglang", "--sglang-version", "0.5.11", "-o", str(out_path), "--force"
    )
    new = read_script(out_path)
    assert new.value("engine_kwargs.sglang.msprobe_dump_config") == CONFIGS[3]
    # inference: eager and the dump argument only; the batch is left alone
    assert new.value("data.train_batch_size") == 1024
    assert new.value("rollout.enforce_eager") is True and new.env["TORCHDYNAMO_DISABLE"].value == "1"


def test_training_mode_script_and_refusal_on_old_verl(workflow_scripts: Path, tmp_path: Path) -> None:
    out_path = workflow_scripts / "out.sh"
    given = tmp_path / "given.json"
    shutil.copy(CONFIG_FILES / "config_training.json", given)
    args = ("script", str(workflow_scripts / "grpo_fsdp_vllm.sh"), "--mode", "training", "--training-config", given)
    code, out = cli_json(*args, "--stages", "actor_compute_log_prob,actor_update", "-o", str(out_path))
    assert code == ExitCode.OK, out
    new = read_script(out_path)
    assert new.value("global_profiler.tool") == "precision_debugger"
    assert new.value("precision_debugger.config_path") == str(given)
    assert new.value("precision_debugger.stages") == ["actor_compute_log_prob", "actor_update"]
    assert new.value("actor_rollout_ref.actor.profiler.enable") is True
    assert new.value("actor_rollout_ref.ref.profiler.enable", "unset") == "unset"
    given.unlink()  # gone after the script was written: check-script names it
    code, out = cli_json("check-script", str(out_path), "--mode", "training")
    assert code == ExitCode.VERIFY_FAILED and f"no such file: {given}" in json.dumps(out["checks"]), out
    configs = msprobe_configs(tmp_path / "configs")
    text = out_path.read_text().replace(str(given), configs[5])
    out_path.write_text(text)
    code, out = cli_json("check-script", str(out_path), "--mode", "training")
    assert code == ExitCode.OK, out
    # a training config with dump_path fails check-script
    config = tmp_path / "t.json"
    config.write_text(json.dumps({"task": "statistics", "dump_path": "/x", "level": "mix"}))
    text = out_path.read_text().replace(configs[5], str(config))
    out_path.write_text(text)
    code, out = cli_json("check-script", str(out_path), "--mode", "training")
    assert code == ExitCode.VERIFY_FAILED
    assert any("dump_path is set" in c["detail"] for c in out["checks"] if not c["ok"])


def test_usage_errors(workflow_scripts: Path) -> None:
    code, out = cli_json("script", str(workflow_scripts / "grpo_fsdp_vllm.sh"), *CONFIGS)  # mode unknown in that script
    assert code == ExitCode.REFUSED and "mode is unknown" in out["message"]


@pytest.mark.parametrize("mode", ["consistency", "inference", "training"])
def test_script_writes_the_configs_it_is_not_given(workflow_scripts: Path, mode: str) -> None:
    """Issue 42, item 2: `script run_grpo.sh --mode consistency --verl-root /verl` (the README's step 3) had exited 2
    for want of --actor-config / --generate-config. Each side's msprobe config not given is written beside the
    collection script with config's rules (its dump_path a folder beside it), named by the script, and the
    check-script the script prints next passes as printed."""
    out_path = workflow_scripts / "collect.sh"
    result = cli("script", str(workflow_scripts / "grpo_fsdp_vllm.sh"), "--mode", mode, "-o", str(out_path))
    assert result.exit_code == ExitCode.OK, result.output
    sides = {"consistency": ["actor", "generate"], "inference": ["generate"], "training": ["training"]}[mode]
    for side in sides:
        config = workflow_scripts / f"collect.{side}.json"
        data = json.loads(config.read_text())
        assert f"wrote {config} (the {side} side's msprobe config" in result.output
        if side == "training":
            assert "dump_path" not in data
        else:
            assert data["dump_path"] == str(workflow_scripts / "collect.dump" / side)
        assert str(config) in out_path.read_text()
    for command in printed_commands(result.output):
        checked = cli(*command[1:])
        assert checked.exit_code == ExitCode.OK, (command, checked.output)


def test_script_refuses_a_config_that_is_not_there(workflow_scripts: Path) -> None:
    """Issue 42, item 6: a collection script naming an --actor-config that does not exist had been written (exit 0);
    refused (exit 3), naming it, and nothing is written."""
    out_path = workflow_scripts / "collect.sh"
    missing = workflow_scripts / "nowhere" / "config_actor.json"
    args = ("--mode", "consistency", "--actor-config", str(missing), "-o", str(out_path))
    code, out = cli_json("script", str(workflow_scripts / "grpo_fsdp_vllm.sh"), *args)
    assert code == ExitCode.REFUSED and str(missing) in out["message"] and "no such file" in out["message"], out
    assert not out_path.exists() and not list(workflow_scripts.glob("collect*"))


@pytest.mark.parametrize("version", ["0.5.8", "0.5.11"])
def test_sglang_consistency_sets_what_pairing_needs(workflow_scripts: Path, version: str) -> None:
    """One request per prefill pass, no radix cache, no chunked prefill, eager: what check-dump
    needs to pair SGLang prefills with actor micro-batches by rid; each with its reason."""
    out_path = workflow_scripts / "out.sh"
    configs = msprobe_configs(workflow_scripts / "configs", rollout_backend="sglang")[:4]
    args = ("--rollout-backend", "sglang", "--sglang-version", version, "-o", str(out_path))
    code, out = cli_json(
        "script", str(workflow_scripts / "grpo_fsdp_vllm.sh"), "--mode", "consistency", *configs, *args
    )
    assert code == ExitCode.OK, out
    new = read_script(out_path)
    assert new.value("actor_rollout_ref.rollout.max_num_seqs") == 1
    assert new.value("engine_kwargs.sglang.disable_radix_cache") is True
    assert new.value("engine_kwargs.sglang.chunked_prefill_size") == -1
    assert new.value("rollout.enforce_eager") is True
    text = out_path.read_text()
    assert "++actor_rollout_ref.rollout.engine_kwargs.sglang.disable_radix_cache=True" in text
    assert any("dispatch_log.jsonl" in n and "--mode consistency" in n for n in out["notices"])
    if version == "0.5.8":  # sglang.model-runner reads its config from the environment
        assert "msprobe_dump_config" not in text
        assert new.env["MSPROBE_SGLANG_CONFIG"].value == configs[3]
    else:
        assert new.value("engine_kwargs.sglang.msprobe_dump_config") == configs[3]
    check = ("--mode", "consistency", "--rollout-backend", "sglang", "--sglang-version", version)
    code, out = cli_json("check-script", str(out_path), *check)
    assert code == ExitCode.OK, out


def test_prompts_only_turns_off_the_kl_penalty_in_the_reward(tmp_path: Path) -> None:
    """verl 0.8.0's own RLOO example keeps `algorithm.use_kl_in_reward=True`: under PROMPTS_ONLY the
    responses are cut to length 0 while `rm_scores` keep their length, so verl's KL penalty fails at
    the advantage step. The derived script turns it off; check-script fails the original, naming it."""
    example = SHARED / "upstream/verl-examples/v0.8.0/examples"
    example /= "rloo_trainer/run_qwen3_8b_fsdp.sh"
    if not example.is_file():
        pytest.skip("../shared/upstream is not beside the repository")
    key = "algorithm.use_kl_in_reward"
    assert read_script(example).value(key) is True
    out_path = tmp_path / "collect.sh"
    code, out = cli_json(
        "script", str(example), "--mode", "consistency", *CONFIGS, "--n-gpus", "2", "-o", str(out_path)
    )
    assert code == ExitCode.OK, out
    assert read_script(out_path).value(key) is False
    code, checked = cli_json("check-script", str(example), "--mode", "consistency")
    failed = [c for c in checked["checks"] if not c["ok"]]
    assert code != ExitCode.OK and any(key in json.dumps(c) for c in failed), failed
    code, checked = cli_json("check-script", str(out_path), "--mode", "consistency")
    assert not [c for c in checked["checks"] if not c["ok"] and key in json.dumps(c)]


GPG_FSDP = SHARED / "upstream/verl-examples/v0.8.0/examples/gpg_trainer/run_qwen3_8b_fsdp.sh"


@pytest.mark.skipif(not GPG_FSDP.is_file(), reason="../shared/upstream is not beside the repository")
def test_relative_configs_resolve_where_bash_runs_and_a_missing_one_fails(tmp_path: Path, monkeypatch) -> None:
    """Issue 35, item 4: check-script resolved relative config paths against the script's folder (bash and
    the processes it starts read them from the directory they run in), and with the configs missing it
    warned and said "script OK", exit 0. verl 0.8.0's own FSDP + vLLM example, derived with relative
    configs into another folder: it passes run from the directory holding them, or with --cwd naming it;
    from anywhere else it fails, naming each missing path and the directory it was resolved against."""
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    (work / "configs").mkdir(parents=True)
    (work / "scripts").mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(work)
    for side in ("actor", "generate"):
        args = ("config", "--mode", "consistency", "--side", side, "--dump-path", f"/d/{side}")
        code, res = cli_json(*args, "--rollout-backend", "vllm", "-o", f"configs/{side}.json", "--no-check")
        assert code == ExitCode.OK, res
    derived = work / "scripts" / "derived.sh"
    configs = ("--actor-config", "configs/actor.json", "--generate-config", "configs/generate.json")
    code, out = cli_json("script", GPG_FSDP, "--mode", "consistency", *configs, "--n-gpus", "2", "-o", derived)
    assert code == ExitCode.OK, out
    check = ("check-script", derived, "--mode", "consistency", "--n-gpus", "2")
    code, out = cli_json(*check)
    assert code == ExitCode.OK, [c for c in out["checks"] if not c["ok"]]
    assert any(c["name"] == "generate config configs/generate.json" and c["ok"] for c in out["checks"]), out
    monkeypatch.chdir(elsewhere)
    for where, extra in ((work / "scripts", ("--cwd", work / "scripts")), (elsewhere, ())):  # the script's folder too
        result = cli(*check, *extra)
        assert result.exit_code == ExitCode.VERIFY_FAILED, result.output
        assert result.stdout.strip().splitlines()[-1] == "script check FAILED"
        for side in ("actor", "generate"):
            line = next(x for x in result.stdout.splitlines() if f"{side} config configs/{side}.json" in x)
            assert line.strip().startswith("FAIL"), line
            assert f"no such file: {where / 'configs' / f'{side}.json'}" in line, line
            assert f"resolved against {where}" in line and "--cwd DIR" in line, line
    code, out = cli_json(*check, "--cwd", work)
    assert code == ExitCode.OK, [c for c in out["checks"] if not c["ok"]]
