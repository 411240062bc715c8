"""`rlprobe-patch detect`: every branch of the mode / backend decisions, from parsed scripts and YAML."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest
from conftest import CONFIGS, FIXTURES, cli
from script_oracle import SHARED

from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.launch.script import read_script
from rlprobe_patch.workflow.detect import detect_script

SCRIPTS = FIXTURES / "workflow" / "scripts"


def detect_json(*args: str) -> tuple[int, dict]:
    result = cli("detect", *args, "--no-trees", "--json")
    return result.exit_code, json.loads(result.stdout)


@pytest.mark.parametrize(
    ("name", "mode", "train", "rollout"),
    [
        ("grpo_fsdp_vllm.sh", "unknown", "fsdp2", "vllm"),
        ("consistency_fsdp_vllm.sh", "consistency", "fsdp", "vllm"),
        ("training_profiler.sh", "training", "megatron", "vllm"),
        ("inference_sglang.sh", "inference", "fsdp", "sglang"),
        ("run_megatron_yaml.sh", "training", "megatron", "sglang"),  # all from YAML
        ("megatron_misaligned.sh", "unknown", "megatron", "vllm"),  # --config-name ppo_megatron_trainer
    ],
)
def test_fixture_scripts(name: str, mode: str, train: str, rollout: str) -> None:
    code, out = detect_json(str(SCRIPTS / name))
    assert code == ExitCode.OK
    assert (out["mode"], out["train_backend"], out["rollout_backend"]) == (mode, train, rollout)
    for decision, value in (("mode", mode), ("train_backend", train), ("rollout_backend", rollout)):
        if value != "unknown":
            assert any(s["decision"] == decision and s["value"] in value for s in out["signals"]), decision


def test_consistency_signals_have_the_skill_points() -> None:
    _code, out = detect_json(str(SCRIPTS / "consistency_fsdp_vllm.sh"))
    points = {(s["value"], s["evidence"]): s["points"] for s in out["signals"] if s["decision"] == "mode"}
    assert points[("consistency", "DUMP_ON and PROMPTS_ONLY set")] == 8
    assert points[("consistency", "the words '训推一致'")] == 5
    assert points[("consistency", "DUMP_ON together with PROMPTS_ONLY")] == 5
    assert out["scores"] == {"training": 0, "inference": 8, "consistency": 18}
    dump = next(s for s in out["signals"] if s["value"] == "inference" and s["points"] == 6)
    assert "/home/dump/config_generate.json" in dump["evidence"]  # ${GEN_CONFIG} expanded
    assert dump["where"] == "consistency_fsdp_vllm.sh:15"


def test_yaml_only_settings_are_read_with_defaults(tmp_path: Path) -> None:
    _code, out = detect_json(str(SCRIPTS / "run_megatron_yaml.sh"))
    files = {Path(y["path"]).name: y for y in out["yaml_files"]}
    assert files["ppo_megatron_dump.yaml"]["loaded"] and files["base_cluster.yaml"]["loaded"]
    tool = next(s for s in out["signals"] if s["points"] == 8)
    assert tool["where"].endswith("ppo_megatron_dump.yaml")
    script = read_script(SCRIPTS / "run_megatron_yaml.sh")
    assert script.value("trainer.n_gpus_per_node") == 8  # from the defaults file
    assert script.value("trainer.project_name") == "yaml_only_example"  # command line


def test_commented_switch_does_not_count() -> None:
    d = detect_script(SCRIPTS / "inference_sglang.sh")
    assert d.scores["consistency"] == 0
    assert d.mode == "inference"


def test_ties_go_training_inference_consistency(tmp_path: Path) -> None:
    script = tmp_path / "tie.sh"
    # inference 6 (dump config) + 2 (eager) = 8; consistency 8 (DUMP_ON used) -> inference wins the tie
    script.write_text(
        'if [ "$DUMP_ON" = 1 ]; then echo on; fi\n'
        "python3 -m verl.trainer.main_ppo actor_rollout_ref.rollout.enforce_eager=True \\\n"
        "  ++actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.dump_config_path=/c.json\n"
    )
    d = detect_script(script)
    assert d.scores["inference"] == 8
    assert d.scores["consistency"] == 8 + 5  # used, and together with a dump config
    assert d.mode == "consistency"
    d = detect_script(script, "inference")
    assert d.mode == "inference"  # +10 from the hint

    tie = tmp_path / "tie2.sh"  # training 8 (tool) against inference 6 + 2: training comes first
    tie.write_text(
        "python3 -m verl.trainer.main_ppo global_profiler.tool=precision_debugger \\\n"
        "  actor_rollout_ref.rollout.enforce_eager=True \\\n"
        "  ++actor_rollout_ref.rollout.engine_kwargs.sglang.msprobe_dump_config=/c.json\n"
    )
    d = detect_script(tie)
    assert d.scores["training"] == d.scores["inference"] == 8
    assert d.mode == "training"


@pytest.mark.parametrize(
    ("hint", "mode"),
    [
        ("consistency", "consistency"),
        ("请做训推一致采集", "consistency"),
        ("推理采集", "inference"),
        ("只采 actor_update", "training"),
        ("rollout dump please", "inference"),
    ],
)
def test_hints(hint: str, mode: str) -> None:
    d = detect_script(SCRIPTS / "grpo_fsdp_vllm.sh", hint)
    assert d.mode == mode


def test_yaml_multiline_rollout_name_and_yaml_path_reference(tmp_path: Path) -> None:
    (tmp_path / "rollout.yaml").write_text("actor_rollout_ref:\n  rollout:\n    name: sglang\n")
    (tmp_path / "run.sh").write_text(
        "CFG=rollout.yaml\npython3 -m verl.trainer.main_ppo trainer.nnodes=1 # $CFG\ncp $CFG /tmp/x\n"
    )
    d = detect_script(tmp_path / "run.sh")
    assert d.rollout_backend == "sglang"
    assert d.signals_for("rollout_backend")[0].where.endswith("rollout.yaml")


def test_the_last_word_on_the_backend_is_hydras(tmp_path: Path) -> None:
    (tmp_path / "run.sh").write_text(
        "python3 -m verl.trainer.main_ppo --config-name ppo_megatron_trainer actor_rollout_ref.actor.strategy=fsdp\n"
    )
    d = detect_script(tmp_path / "run.sh")
    assert d.train_backend == "fsdp"  # the override sets the actor's strategy after the config chose megatron
    assert d.signals_for("train_backend")[0].where == "run.sh:1"


def test_override_parsing(tmp_path: Path) -> None:
    text = textwrap.dedent(
        """\
        #!/bin/bash
        N=${N_GPUS:-4}
        export DUMP_ON=0
        PYTHONUNBUFFERED=1 python3 -m verl.trainer.main_ppo \\
            data.train_batch_size=$((16)) \\
            trainer.n_gpus_per_node=$N \\
            '+actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config={dump_config_path:"/p.json"}' \\
            ++global_profiler.steps='[1,2]' \\
            trainer.logger=["console","wandb"] \\
            trainer.experiment_name="a b c" \\
            algorithm.rollout_correction.rollout_is=null \\
            ~trainer.val_files \\
            trainer.flag=True   # a comment with key=value
        """
    )
    (tmp_path / "run.sh").write_text(text)
    s = read_script(tmp_path / "run.sh")
    keys = [(o.prefix, o.key) for o in s.overrides]
    assert keys == [
        ("", "data.train_batch_size"),
        ("", "trainer.n_gpus_per_node"),
        ("+", "actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config"),
        ("++", "global_profiler.steps"),
        ("", "trainer.logger"),
        ("", "trainer.experiment_name"),
        ("", "algorithm.rollout_correction.rollout_is"),
        ("~", "trainer.val_files"),
        ("", "trainer.flag"),
    ]
    assert s.value("trainer.n_gpus_per_node") == 4
    assert s.value("additional_config.dump_config_path") == "/p.json"
    assert s.value("global_profiler.steps") == [1, 2]
    assert s.value("trainer.logger") == ["console", "wandb"]
    assert s.value("trainer.experiment_name") == "a b c"
    assert s.value("algorithm.rollout_correction.rollout_is", "missing") is None
    assert s.value("trainer.flag") is True
    assert s.env["DUMP_ON"].value == "0" and s.env["PYTHONUNBUFFERED"].value == "1"
    assert s.overrides[-1].line == 13


def test_trees_found_without_importing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    shutil.copytree(FIXTURES / "verl-0.9" / "verl", site / "verl")
    for package, dist, version in (("sglang", "sglang", "0.5.10"), ("vllm_ascend", "vllm_ascend", "0.13.0")):
        (site / package).mkdir()
        (site / package / "__init__.py").write_text("raise RuntimeError('imported!')\n")
        meta = site / f"{dist}-{version}.dist-info"
        meta.mkdir()
        (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    result = cli("detect", str(SCRIPTS / "inference_sglang.sh"), "--json")
    out = json.loads(result.stdout)
    trees = out["trees"]
    assert trees["verl"]["found"] and trees["verl"]["root"] == str(site)
    assert trees["sglang"] == {
        "found": True,
        "location": str(site / "sglang"),
        "version": "0.5.10",
        "distribution": "sglang",
    }
    assert trees["vllm_ascend"]["version"] == "0.13.0"
    assert trees["vllm"]["found"] is False


def test_missing_script_is_refused(tmp_path: Path) -> None:
    result = cli("detect", str(tmp_path / "nope.sh"), "--no-trees", "--json")
    assert result.exit_code == ExitCode.REFUSED
    assert "no such file" in json.loads(result.stdout)["message"]


SGLANG_EXAMPLE = (SHARED / "upstream/verl-examples/v0.6.1/examples/grpo_trainer") / "run_qwen2_5_vl-7b-sglang.sh"


@pytest.mark.skipif(not SGLANG_EXAMPLE.is_file(), reason="../shared/upstream is not beside the repository")
def test_sglang_rollout_says_what_rid_pairing_needs(tmp_path: Path) -> None:
    """verl's own SGLang example: detect lists the four server settings check-dump's rid pairing
    needs against the script's values (the example runs CUDA graphs: enforce_eager=False); the
    script `script --mode consistency` derives from it has all four."""
    result = cli("detect", str(SGLANG_EXAMPLE), "--hint", "consistency", "--no-trees", "--json")
    out = json.loads(result.stdout)
    assert result.exit_code == ExitCode.OK and out["rollout_backend"] == "sglang" and out["mode"] == "consistency"
    rows = {row["key"].rsplit(".", 1)[-1]: row for row in out["sglang_pairing"]}
    assert {k: (r["wanted"], r["ok"]) for k, r in rows.items()} == {
        "max_num_seqs": (1, False),
        "disable_radix_cache": (True, False),
        "chunked_prefill_size": (-1, False),
        "enforce_eager": (True, False),
    }
    assert rows["enforce_eager"]["found"] is False and rows["enforce_eager"]["source"].endswith(":38")
    assert all(r["why"] for r in rows.values())
    assert any("check-dump pairs prefills" in n and "enforce_eager" in n for n in out["notices"])

    derived = tmp_path / "collect.sh"
    configs = (*CONFIGS, "--n-gpus", "1")
    result = cli("script", str(SGLANG_EXAMPLE), "--mode", "consistency", *configs, "-o", str(derived))
    assert result.exit_code == ExitCode.OK, result.output
    out = json.loads(cli("detect", str(derived), "--no-trees", "--json").stdout)
    assert out["mode"] == "consistency" and all(row["ok"] for row in out["sglang_pairing"]), out["sglang_pairing"]
    assert not any("check-dump pairs prefills" in n for n in out["notices"])
    # a vLLM rollout gets no such list
    vllm = cli("detect", str(SCRIPTS / "grpo_fsdp_vllm.sh"), "--no-trees", "--json")
    assert json.loads(vllm.stdout)["sglang_pairing"] == []
