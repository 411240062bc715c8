"""`rlprobe-patch script` / `check-script` against real releases' configs (Hydra composes what is
written; keys a release does not have are skipped). The rest: tests/cli/test_workflow_script.py.
"""

from __future__ import annotations

import difflib
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CONFIG_FILES, CONFIGS, cli, cli_json, msprobe_configs
from omegaconf import OmegaConf
from script_oracle import SHARED, compose_config, run_in_checkout

from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.launch.script import ReaderOptions, read_script

TRAINING = str(
    CONFIG_FILES / "config_training.json"
)  # a training config that exists (script refuses one that does not)


def test_training_mode_is_refused_before_verl_0_8(workflow_scripts: Path, real_tree) -> None:
    args = ("script", str(workflow_scripts / "grpo_fsdp_vllm.sh"), "--mode", "training", "--training-config", TRAINING)
    code, out = cli_json(*args, "--verl-root", str(real_tree("0.7.1")), "-o", str(workflow_scripts / "x.sh"))
    assert code == ExitCode.REFUSED and "no precision_debugger profiler" in out["details"][0]


def test_keys_missing_from_the_release_config_are_skipped(workflow_scripts: Path, real_tree) -> None:
    """verl 0.6.0 has no rollout correction: those keys are skipped; the dump config is created (`++`)."""
    root = real_tree("0.6.0")
    code, out = cli_json(
        "script",
        str(workflow_scripts / "grpo_fsdp_vllm.sh"),
        "--mode",
        "consistency",
        *CONFIGS,
        "--verl-root",
        str(root),
        "-o",
        str(workflow_scripts / "out.sh"),
    )
    assert code == ExitCode.OK, out
    actions = {c["key"]: c["action"] for c in out["changes"]}
    assert actions["algorithm.rollout_correction.rollout_is"] == "skipped"  # not in that release's config
    assert actions["trainer.balance_batch"] == "set"
    dump_key = "actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.dump_config_path"
    assert actions[dump_key] == "added"
    text = (workflow_scripts / "out.sh").read_text()
    assert "rollout_correction" not in text and f"++{dump_key}={CONFIGS[3]}" in text
    derived = read_script(workflow_scripts / "out.sh", ReaderOptions(verl_root=root, release="0.6.0"))
    assert derived.composed is not None and not derived.composed.errors  # Hydra composes what we wrote
    assert derived.value(dump_key) == CONFIGS[3]


def test_v061_example_on_a_091_tree_gets_its_dump_config_and_gpu_count(real_tree, tmp_path: Path) -> None:
    """The two silent wrong outcomes measured in issue 12 (verl's own grpo_trainer/run_qwen2-7b_math.sh):
    the rollout dump config was skipped as "not in this verl release's config" though `++` creates it,
    and `--n-gpus 2` passed the TP check while the derived script still ran 8 GPUs."""
    example = SHARED / "upstream/verl-examples/v0.6.1/examples"
    example /= "grpo_trainer/run_qwen2-7b_math.sh"
    if not example.is_file():
        pytest.skip("../shared/upstream is not beside the repository")
    root = real_tree("0.9.1")
    out_path = tmp_path / "collect.sh"
    configs = msprobe_configs(tmp_path / "configs")[:4]
    args = ("script", str(example), "--mode", "consistency", *configs, "--verl-root", str(root), "-o", str(out_path))
    code, out = cli_json(*args, "--n-gpus", "2")
    assert code == ExitCode.OK, out
    derived = read_script(out_path, ReaderOptions(verl_root=root, release="0.9.1"))
    assert derived.composed is not None and not derived.composed.errors
    key = "actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.dump_config_path"
    assert derived.value(key) == configs[3]
    assert derived.fact("n_gpus_per_node") * derived.fact("nnodes") == 2
    assert derived.fact("rollout_tp") == 2
    code, checked = cli_json("check-script", str(out_path), "--mode", "consistency", "--verl-root", str(root))
    assert code == ExitCode.OK, [c for c in checked["checks"] if not c["ok"]]


MULTITURN = SHARED / "upstream/verl-examples/v0.6.1/examples/sglang_multiturn/run_qwen2.5-3b_gsm8k_multiturn.sh"


@pytest.mark.skipif(not MULTITURN.is_file(), reason="../shared/upstream is not beside the repository")
def test_detect_refuses_when_both_backends_are_unknown(real_tree, tmp_path: Path, monkeypatch) -> None:
    """Issue 29: verl's own multi-turn example names its config folder relative to the checkout it runs
    from; a copy outside any checkout, run from elsewhere: Hydra finds no config and neither backend is
    known: exit 3 (it was 0), the last line says so, `ok: false` in JSON; the report with Hydra's error is
    still printed. (Inside a checkout that holds the folder, it is read from there: issue 42,
    tests/real/test_detect_elsewhere.py.)"""
    root = real_tree("0.6.1")
    alone = tmp_path / "alone" / MULTITURN.name
    alone.parent.mkdir()
    shutil.copy(MULTITURN, alone)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    result = cli("detect", str(alone), "--verl-root", str(root))
    assert result.exit_code == ExitCode.REFUSED, result.stdout
    assert "train backend: unknown" in result.stdout and "Primary config directory not found" in result.stdout
    assert result.stdout.strip().splitlines()[-1].startswith("refused: neither the training nor the rollout backend")
    code, out = cli_json("detect", alone, "--verl-root", root)
    assert code == ExitCode.REFUSED and out["ok"] is False
    assert (out["train_backend"], out["rollout_backend"]) == ("unknown", "unknown")


VL_EXAMPLE = SHARED / "upstream/verl-examples/v0.8.0/examples/grpo_trainer/run_qwen2_5_vl_7b_fsdp.sh"


@pytest.mark.skipif(not VL_EXAMPLE.is_file(), reason="../shared/upstream is not beside the repository")
def test_the_next_line_script_prints_works_as_printed(real_tree, tmp_path: Path, monkeypatch) -> None:
    """Issue 29: `script` ends with `next: rlprobe-patch check-script X --mode M`; run as printed (without the
    --verl-root and --env the script was derived with) it failed 6 checks. The line now carries them, and
    running exactly that line passes."""
    root = real_tree("0.8.0")
    monkeypatch.chdir(tmp_path)
    derived = tmp_path / "derived.sh"
    configs = msprobe_configs(tmp_path / "configs", rollout_backend="sglang")[:4]
    args = ["script", str(VL_EXAMPLE), "--mode", "consistency", *configs, "--verl-root", str(root)]
    result = cli(*args, "--env", "INFER_BACKEND=sglang", "--n-gpus", "2", "-o", str(derived))
    assert result.exit_code == ExitCode.OK, result.output
    lines = [x for x in result.stdout.splitlines() if x.startswith("next: ")]  # the dump run, its capture run
    capture = derived.with_name(f"{derived.stem}.capture.sh")
    for line, checked_script in zip(lines, (derived, capture), strict=True):
        command = shlex.split(line.removeprefix("next: "))
        assert command[:2] == ["rlprobe-patch", "check-script"] and command[2] == str(checked_script)
        checked = cli(*command[1:])
        assert checked.exit_code == ExitCode.OK, (line, checked.output)
        assert checked.stdout.strip().splitlines()[-1] == "script OK"


@pytest.mark.skipif(not VL_EXAMPLE.is_file(), reason="../shared/upstream is not beside the repository")
def test_the_derived_script_pins_the_env_it_was_derived_with(real_tree, tmp_path: Path, monkeypatch) -> None:
    """Issue 29: derived with --env INFER_BACKEND=sglang, the script ran by plain bash launched rollout.name=vllm
    with SGLang's dump config. The derived script exports the --env values before the user's own lines: bash
    (the recording launchers of tests/script_oracle.py) launches exactly the overrides `script` printed, the
    SGLang rollout, and its dump config, from a shell where INFER_BACKEND is unset."""
    root = real_tree("0.8.0")
    repo = tmp_path / "verl"
    (repo / "examples").mkdir(parents=True)
    shutil.copy(VL_EXAMPLE, repo / "examples" / VL_EXAMPLE.name)
    (repo / "verl").symlink_to(root / "verl")
    monkeypatch.chdir(repo)
    original, derived = f"examples/{VL_EXAMPLE.name}", "examples/derived.sh"
    args = ["script", original, "--mode", "consistency", *CONFIGS, "--verl-root", str(root), "-o", derived]
    code, out = cli_json(*args, "--env", "INFER_BACKEND=sglang", "--n-gpus", "2")
    assert code == ExitCode.OK, out
    assert out["pinned_env"] == {"INFER_BACKEND": "sglang"} and out["rollout_backend"] == "sglang"
    launch = run_in_checkout(repo, derived, root).main
    assert launch is not None and not launch.error, launch
    assert launch.facts["rollout_backend"] == "sglang"
    config = compose_config(launch.entry, launch.args, root, repo)
    assert OmegaConf.select(config, "actor_rollout_ref.rollout.name") == "sglang"
    dump_key = next(c["key"] for c in out["changes"] if c["key"].endswith("msprobe_dump_config"))
    assert ".sglang." in dump_key and OmegaConf.select(config, dump_key) == CONFIGS[3]
    printed = {f"{c['key']}={c['value']}" for c in out["changes"] if c["action"] in ("set", "added")}
    launched = {a.removeprefix("++") for a in launch.args}
    assert printed <= launched, printed - launched


@pytest.mark.skipif(not VL_EXAMPLE.is_file(), reason="../shared/upstream is not beside the repository")
def test_trtllm_rollout_is_named_and_refused_where_it_cannot_dump(real_tree, tmp_path: Path, monkeypatch) -> None:
    """Issue 29, item 7: v0.8.0's VL example offers TensorRT-LLM through INFER_BACKEND. bash + Hydra say the run
    is `rollout.name=trtllm`, a name verl 0.8.0's rollout config knows; detect names it and says no msprobe
    rollout dump exists for it; script and check-script refuse inference and consistency (exit 3), training
    mode derives."""
    root = real_tree("0.8.0")
    assert '"trtllm"' in (root / "verl/workers/config/rollout.py").read_text()  # verl runs it
    repo = tmp_path / "verl"
    (repo / "examples").mkdir(parents=True)
    shutil.copy(VL_EXAMPLE, repo / "examples" / VL_EXAMPLE.name)
    (repo / "verl").symlink_to(root / "verl")
    monkeypatch.chdir(repo)
    original = f"examples/{VL_EXAMPLE.name}"
    pinned = repo / "pinned.sh"  # the oracle runs with a clean environment: INFER_BACKEND set by a wrapper
    pinned.write_text(f"export INFER_BACKEND=trtllm\nbash {original}\n")
    launch = run_in_checkout(repo, "pinned.sh", root).main
    assert launch is not None and not launch.error and launch.facts["rollout_backend"] == "trtllm"
    env = ("--env", "INFER_BACKEND=trtllm")
    code, out = cli_json("detect", original, "--verl-root", str(root), *env)
    assert out["rollout_backend"] == "trtllm", out
    assert any("trtllm (TensorRT-LLM): no msprobe rollout dump exists for it" in n for n in out["notices"]), out
    for mode in ("inference", "consistency"):
        for command in (("script", original, *CONFIGS, "-o", "x.sh"), ("check-script", original)):
            code, out = cli_json(*command, "--mode", mode, "--verl-root", str(root), *env)
            assert code == ExitCode.REFUSED, (command, mode, out)
            assert "no msprobe rollout dump exists for it" in out["details"][0], out
            assert "--set" not in out.get("hint", ""), out  # no --set can make it collectable
    code, out = cli_json("script", original, "--mode", "training", "--training-config", TRAINING, "-o", "t.sh",
                         "--verl-root", str(root), *env)  # fmt: skip
    assert code == ExitCode.OK, out


V080 = SHARED / "upstream/verl-examples/v0.8.0/examples"


def _v080_checkout(tmp_path: Path, root: Path, *scripts: str) -> Path:
    repo = tmp_path / "verl"
    for rel in scripts:
        (repo / "examples" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(V080 / rel, repo / "examples" / rel)
    (repo / "verl").symlink_to(root / "verl")
    return repo


@pytest.mark.skipif(not V080.is_dir(), reason="../shared/upstream is not beside the repository")
def test_consistency_aligns_cp_and_lists_set_values_as_set(real_tree, tmp_path: Path, monkeypatch) -> None:
    """Issue 29, item 9: v0.8.0's `mtp_trainer/run_mimo_7b_mtp_megatron.sh` runs Megatron CP 2 (`ACTOR_CP:-2`):
    each CP rank holds a part of every sequence, so CP is set to 1 with a notice (as SP is for FSDP), and bash +
    Hydra launch CP 1 on actor and ref. The `--set` values its refusal names changed settings of the script:
    they are listed as `set` with the value they replace, never as `kept`."""
    root = real_tree("0.8.0")
    rel = "mtp_trainer/run_mimo_7b_mtp_megatron.sh"
    repo = _v080_checkout(tmp_path, root, rel)
    monkeypatch.chdir(repo)
    original, derived = f"examples/{rel}", "examples/derived.sh"
    before = run_in_checkout(repo, original, root).main
    assert before is not None and not before.error
    cp_key = "actor_rollout_ref.actor.megatron.context_parallel_size"
    assert OmegaConf.select(compose_config(before.entry, before.args, root, repo), cp_key) == 2
    configs = msprobe_configs(tmp_path / "configs", rollout_backend=before.facts["rollout_backend"])[:4]
    args = ["script", original, "--mode", "consistency", *configs, "--verl-root", str(root), "-o", derived]
    code, out = cli_json(*args)
    assert code == ExitCode.REFUSED, out
    command = shlex.split(out["hint"].split(", run: ", 1)[1])  # the hint's command, run as printed
    sets = [command[i + 1] for i, word in enumerate(command) if word == "--set"]
    assert sets and command[:2] == ["rlprobe-patch", "script"]
    code, out = cli_json(*command[1:])
    assert code == ExitCode.OK, out
    changes = {c["key"]: c for c in out["changes"]}
    for item in sets:
        key, value = item.split("=", 1)
        assert changes[key]["action"] == "set" and changes[key]["value"] == value, changes[key]
        assert "--set" in changes[key]["source"] and changes[key]["old"] not in (None, value), changes[key]
    assert any(n.startswith(f"{cp_key} was 2 (") and "forced to 1" in n for n in out["notices"]), out["notices"]
    launch = run_in_checkout(repo, derived, root).main
    assert launch is not None and not launch.error, launch
    config = compose_config(launch.entry, launch.args, root, repo)
    assert OmegaConf.select(config, cp_key) == 1
    assert OmegaConf.select(config, "actor_rollout_ref.ref.megatron.context_parallel_size") == 1
    for item in sets:
        key, value = item.split("=", 1)
        assert str(OmegaConf.select(config, key)) == value
    code, checked = cli_json("check-script", derived, "--mode", "consistency", "--verl-root", str(root))
    assert code == ExitCode.OK, [c for c in checked["checks"] if not c["ok"]]


@pytest.mark.skipif(not V080.is_dir(), reason="../shared/upstream is not beside the repository")
def test_consistency_turns_partial_rollout_off_and_names_pd_only_where_used(
    real_tree, tmp_path: Path, monkeypatch
) -> None:
    """Issue 29, item 9: v0.8.0's fully-async MTP example runs `async_training.partial_rollout=True` (an
    interrupted request is resumed, its rid prefilled again from cache: no pair); the derived script turns it
    off and bash launches that last. The SGLang PD-disaggregation notice appears only where the run uses PD."""
    root = real_tree("0.8.0")
    rel = "mtp_trainer/run_mimo_7b_mtp_fully_async_megatron_multinode.sh"
    repo = _v080_checkout(tmp_path, root, rel)
    monkeypatch.chdir(repo)
    original, derived = f"examples/{rel}", "examples/derived.sh"
    args = ["script", original, "--mode", "consistency", *CONFIGS, "--verl-root", str(root), "-o", derived]
    code, out = cli_json(*args)
    assert code == ExitCode.OK, out
    change = next(c for c in out["changes"] if c["key"] == "async_training.partial_rollout")
    assert (change["action"], change["value"], change["old"]) == ("set", "False", True), change
    launch = run_in_checkout(repo, derived, root).main
    assert launch is not None and not launch.error, launch
    assert [a for a in launch.args if a.startswith("async_training.partial_rollout=")][-1].endswith("=False")
    assert not any("disaggregation" in n for n in out["notices"]), out["notices"]
    assert out["rollout_backend"] == "sglang"
    code, out = cli_json(*args, "--force", "--set", "actor_rollout_ref.rollout.disaggregation.enabled=True")
    assert code == ExitCode.OK, out
    pd = "SGLang with prefill/decode disaggregation (actor_rollout_ref.rollout.disaggregation.enabled=True at --set)"
    assert any(n.startswith(pd) for n in out["notices"]), out["notices"]


V061 = SHARED / "upstream/verl-examples/v0.6.1/examples"


@pytest.mark.skipif(not V061.is_dir(), reason="../shared/upstream is not beside the repository")
def test_launches_from_another_directory(real_tree, tmp_path: Path, monkeypatch) -> None:
    """Issue 29, item 5: v0.6.1's multi-turn examples name their config folder from `$(pwd)` and their YAMLs
    `hydra.searchpath: [file://verl/trainer/config]`, both relative to the checkout verl runs from.
    - Run from elsewhere, the script inside a checkout holding --verl-root's package: read as run from that
      checkout (the folder above the script that holds the config folder, issue 42), with a notice; the
      facts are bash + Hydra's run from there.
    - `--cwd DIR` where DIR holds the examples but not verl/: the config folder resolves, the searchpath does
      not; it is resolved from --verl-root's checkout, and the notice says so.
    - Nothing resolves (a copy of the script outside any checkout): `script` says to name the directory
      (--cwd), not to fix an override."""
    root = real_tree("0.6.1")
    rel = "sglang_multiturn/run_qwen2.5-3b_gsm8k_multiturn.sh"
    repo = tmp_path / "verl"
    repo.mkdir()
    (repo / "examples").symlink_to(V061)
    (repo / "verl").symlink_to(root / "verl")
    truth = run_in_checkout(repo, f"examples/{rel}", root).main
    assert truth is not None and not truth.error and truth.facts["rollout_backend"] == "sglang"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, out = cli_json("detect", repo / "examples" / rel, "--verl-root", root)
    assert code == ExitCode.OK, out
    assert {k: out["facts"][k]["value"] for k in truth.facts} == truth.facts
    assert any(n.startswith(f"read as run from {repo}: the script names the config folder examples/")
               for n in out["notices"]), out["notices"]  # fmt: skip
    no_verl = tmp_path / "examples-only"
    no_verl.mkdir()
    (no_verl / "examples").symlink_to(V061)
    code, out = cli_json("detect", V061 / rel, "--verl-root", root, "--cwd", no_verl)
    assert code == ExitCode.OK, out
    assert {k: out["facts"][k]["value"] for k in truth.facts} == truth.facts
    assert any("hydra.searchpath file://verl/trainer/config" in n and f"--verl-root ({root})" in n
               for n in out["notices"]), out["notices"]  # fmt: skip
    alone = tmp_path / "alone" / "run.sh"
    alone.parent.mkdir()
    shutil.copy(V061 / rel, alone)
    args = ("script", alone, "--mode", "training", "--training-config", TRAINING, "-o", elsewhere / "x.sh")
    code, out = cli_json(*args, "--verl-root", root)
    assert code == ExitCode.REFUSED, out
    assert "--cwd DIR" in out["hint"] and "fix the override" not in out["hint"], out


@pytest.mark.skipif(not V080.is_dir(), reason="../shared/upstream is not beside the repository")
def test_engine_facts_name_the_lines_that_set_them(real_tree, tmp_path: Path, monkeypatch) -> None:
    """Issue 29, item 9: v0.8.0's Megatron examples choose `model_engine=megatron` after setting TP/PP
    (`gpg_trainer/run_qwen3_8b_megatron.sh`: TP/PP at :71/:72, the group at :105). Hydra composes group
    choices before any value override, so the values are the lines' (bash + Hydra agree), and each fact's
    source must be the line that sets its key, not the group's."""
    root = real_tree("0.8.0")
    scripts = sorted(
        p.relative_to(V080).as_posix() for p in V080.rglob("*.sh") if "model_engine=megatron" in p.read_text()
    )
    assert "gpg_trainer/run_qwen3_8b_megatron.sh" in scripts
    repo = _v080_checkout(tmp_path, root, *scripts)
    monkeypatch.chdir(repo)
    keys = {"actor_tp": "tensor_model_parallel_size", "actor_pp": "pipeline_model_parallel_size"}
    checked = 0
    for rel in scripts:
        truth = run_in_checkout(repo, f"examples/{rel}", root).main
        if truth is None or truth.error or not truth.ppo:
            continue
        code, out = cli_json("detect", f"examples/{rel}", "--verl-root", root, "--no-trees")
        assert code == ExitCode.OK, out
        assert out["facts"]["actor_tp"]["value"] == truth.facts["actor_tp"], rel
        lines = (repo / "examples" / rel).read_text().splitlines()
        for fact, key in keys.items():
            source = out["facts"][fact]["source"]
            name, _, number = source.rpartition(":")
            if name != Path(rel).name:
                continue  # a verl default, or a sourced file
            checked += 1
            assert f"actor.megatron.{key}=" in lines[int(number) - 1], (rel, fact, source)
    assert checked >= 4, checked


RECORDING_PYTHON = """#!/bin/bash
for a in "$@"; do [ "$a" = "-c" ] && exit 1; done  # import probes fail: this machine has no torch_npu
printf '%s\\n' "$@" >> "$RECORD"
"""


@pytest.mark.parametrize("shared_line", [False, True])
def test_a_plain_import_probe_is_pinned_where_bash_would_ask_again(
    workflow_scripts: Path, tmp_path: Path, shared_line: bool, real_tree
) -> None:
    """Issue 29: `DEVICE=$(python3 -c 'import torch_npu' ...)` (no `${DEVICE:-...}`, so an exported value
    does not survive it) is answered by the --python that reads the script; the derived script assigns
    that answer again on the line after the probe, and real bash launches the branch that was checked."""
    original = workflow_scripts / "probe.sh"
    probe = "DEVICE=$(python3 -c 'import torch_npu' 2>/dev/null && echo npu || echo gpu)"
    text = (workflow_scripts / "grpo_fsdp_vllm.sh").read_text()
    text = text.replace(
        "NGPUS=8\n",
        f"NGPUS=8\n    {probe}{'; echo $DEVICE' if shared_line else ''}\n"
        'if [ "$DEVICE" = npu ]; then DEVICE_ARG=trainer.val_before_train=False\n'
        "else DEVICE_ARG=trainer.val_before_train=True; fi\n",
    ).replace("trainer.nnodes=1 \\\n", "trainer.nnodes=1 \\\n    $DEVICE_ARG \\\n")
    original.write_text(text)
    (tmp_path / "npu" / "torch_npu").mkdir(parents=True)
    (tmp_path / "npu" / "torch_npu" / "__init__.py").write_text("")
    npu_python = tmp_path / "npu" / "python"
    npu_python.write_text(f'#!/bin/bash\nPYTHONPATH={tmp_path / "npu"} exec {sys.executable} "$@"\n')
    npu_python.chmod(0o755)
    derived = workflow_scripts / "derived.sh"
    code, out = cli_json(
        "script", str(original), "--mode", "inference", "--generate-config", CONFIGS[3],
        "--verl-root", str(real_tree("0.9.1")), "--python", str(npu_python), "-o", str(derived),
    )  # fmt: skip
    assert code == ExitCode.OK, out

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(RECORDING_PYTHON)
    (bin_dir / "python3").chmod(0o755)
    record = tmp_path / "record"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "RECORD": str(record)}
    proc = subprocess.run(["bash", str(derived)], env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    launched = record.read_text().splitlines()
    if shared_line:  # cannot be pinned: said so, and bash asks this machine (gpu)
        assert out["pinned_probes"] == {}
        assert any("DEVICE=npu" in n and "cannot pin it" in n for n in out["notices"]), out["notices"]
        assert "trainer.val_before_train=True" in launched
    else:
        assert out["pinned_probes"] == {"DEVICE": "npu"}
        lines = derived.read_text().splitlines()
        at = lines.index(f"    {probe}")
        assert lines[at + 1].startswith("    DEVICE=npu  # rlprobe-patch:"), lines[at : at + 2]
        assert "trainer.val_before_train=False" in launched and "trainer.val_before_train=True" not in launched
        ops = difflib.SequenceMatcher(None, text, derived.read_text(), autojunk=False).get_opcodes()
        assert all(tag in ("equal", "insert") for tag, *_ in ops)  # the user's lines untouched
