"""The switch reader every hook runs (patches/_shared/switches.py), and `check-script` running it
on the values a launch script exports (issue 15): a typo must never give a run without dumps."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import cli_json, msprobe_configs
from script_oracle import EXAMPLES

from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.workflow.derive import shared_switches

switches = shared_switches()


@pytest.mark.parametrize("word", ["1", "true", "TRUE", "yes", "On", " on "])
@pytest.mark.parametrize("name", ["DUMP_ON", "PROMPTS_ONLY"])
def test_on_spellings(name: str, word: str) -> None:
    assert switches._rlprobe_switch(name, {name: word}) is True


@pytest.mark.parametrize("word", [None, "", "0", "false", "No", "OFF", " 0 "])
@pytest.mark.parametrize("name", ["DUMP_ON", "PROMPTS_ONLY"])
def test_off_spellings(name: str, word: str | None) -> None:
    env = {} if word is None else {name: word}
    assert switches._rlprobe_switch(name, env) is False


@pytest.mark.parametrize("word", ["2", "y", "enable", "tru", "1 1", "-1"])
@pytest.mark.parametrize("name", ["DUMP_ON", "PROMPTS_ONLY"])
def test_other_values_are_errors_naming_variable_value_allowed_and_rank(name: str, word: str) -> None:
    with pytest.raises(ValueError) as caught:
        switches._rlprobe_switch(name, {name: word, "RANK": "3"})
    message = str(caught.value)
    assert f"{name}={word!r}" in message and "on rank 3" in message
    assert "1, true, yes, on" in message and "0, false, no, off" in message


def test_phase() -> None:
    assert switches._rlprobe_switches({})["phase"] == "log_prob"
    for phase in ("log_prob", "update_actor", "all", "ALL "):
        assert switches._rlprobe_switches({"DUMP_PHASE": phase})["phase"] == phase.strip().lower()
    with pytest.raises(ValueError, match=r"DUMP_PHASE='bogus' on rank 0 is not a phase: use one of log_prob"):
        switches._rlprobe_switches({"DUMP_PHASE": "bogus", "RANK": "0"})


def test_warnings_say_what_will_happen() -> None:
    assert switches._rlprobe_switches({"DUMP_ON": "1", "PROMPTS_ONLY": "1"})["warnings"] == []
    (warning,) = switches._rlprobe_switches({"PROMPTS_ONLY": "yes"})["warnings"]
    assert "DUMP_ON is off" in warning and "nothing is dumped" in warning
    (warning,) = switches._rlprobe_switches({"DUMP_ON": "1", "PROMPTS_ONLY": "1", "DUMP_PHASE": "all"})["warnings"]
    assert "DUMP_PHASE=all under PROMPTS_ONLY" in warning


def test_config_path(tmp_path: Path) -> None:
    good = tmp_path / "config.json"
    good.write_text(json.dumps({"task": "statistics"}))
    var = "MSPROBE_ACTOR_CONFIG"
    assert switches._rlprobe_config_path(var, "/nowhere.json", {var: str(good)}) == str(good)
    assert switches._rlprobe_config_path(var, str(good), {}) == str(good)
    with pytest.raises(ValueError, match=rf"{var}=/missing.json on rank 1: no such file"):
        switches._rlprobe_config_path(var, str(good), {var: "/missing.json", "RANK": "1"})
    with pytest.raises(ValueError, match=rf"/missing.json \({var} is not set; this is the hook's default\)"):
        switches._rlprobe_config_path(var, "/missing.json", {})
    bad = tmp_path / "bad.json"
    bad.write_text("{task: 1")
    with pytest.raises(ValueError, match="not JSON"):
        switches._rlprobe_config_path(var, "", {var: str(bad)})
    bad.write_text("[1]")
    with pytest.raises(ValueError, match="not a JSON object"):
        switches._rlprobe_config_path(var, "", {var: str(bad)})
    if os.getuid() != 0:  # root reads everything
        good.chmod(0)
        with pytest.raises(ValueError, match="not readable"):
            switches._rlprobe_config_path(var, "", {var: str(good)})


# -- check-script on a collection script derived from verl's own example ------------------------
EXAMPLE = EXAMPLES / "v0.8.0" / "examples" / "grpo_trainer" / "run_qwen2_5_32b_fsdp.sh"


@pytest.fixture
def derived(tmp_path: Path) -> Path:
    if not EXAMPLE.is_file():
        pytest.fail(f"{EXAMPLE} is missing: the upstream material this test reads (../shared/upstream)")
    original = tmp_path / EXAMPLE.name
    shutil.copy(EXAMPLE, original)
    out = tmp_path / "collect.sh"
    configs = msprobe_configs(tmp_path / "configs")[:4]
    code, doc = cli_json("script", original, "--mode", "consistency", *configs, "--n-gpus", "8", "-o", out)
    assert code == ExitCode.OK, doc
    return out


def exported(path: Path, name: str, value: str) -> None:
    lines = path.read_text().splitlines()
    (index,) = [i for i, line in enumerate(lines) if line.startswith(f"export {name}=")]
    lines[index] = f"export {name}={value}"
    path.write_text("\n".join(lines) + "\n")


def failures(path: Path, *mode: str) -> dict[str, str]:
    code, doc = cli_json("check-script", path, *(mode or ("--mode", "consistency")))
    failed = {c["name"]: c["detail"] for c in doc["checks"] if not c["ok"]}
    assert (code == ExitCode.OK) == (not failed), doc
    return failed


@pytest.mark.parametrize("word", ["yes", "true", "ON"])
def test_check_script_accepts_every_on_spelling(derived: Path, word: str) -> None:
    exported(derived, "DUMP_ON", word)
    assert failures(derived) == {}


@pytest.mark.parametrize(("name", "value"), [("DUMP_ON", "yess"), ("PROMPTS_ONLY", "2"), ("DUMP_PHASE", "logprob")])
def test_check_script_refuses_a_typo_where_the_script_exports_it(derived: Path, name: str, value: str) -> None:
    exported(derived, name, value)
    line = derived.read_text().splitlines().index(f"export {name}={value}") + 1
    detail = failures(derived)[f"{name} value"]
    assert detail.startswith(f"{derived.name}:{line}: {name}={value!r} is not a")


def test_check_script_reads_the_actor_config_the_hook_would_load(derived: Path, tmp_path: Path) -> None:
    config = tmp_path / "actor.json"
    config.write_text("{not json")
    exported(derived, "MSPROBE_ACTOR_CONFIG", str(config))
    failed = failures(derived, "--mode", "consistency", "--actor-config", str(config))
    assert "not JSON" in failed["MSPROBE_ACTOR_CONFIG"]


def test_check_script_warns_prompts_only_without_dumps(derived: Path) -> None:
    exported(derived, "DUMP_ON", "0")
    _, doc = cli_json("check-script", derived, "--mode", "inference")
    warnings = [c["detail"] for c in doc["checks"] if c["warning"] and c["name"] == "switches"]
    assert any("DUMP_ON is off" in w for w in warnings), doc


def test_the_sglang_hook_reads_both_trainers_phase_grammars() -> None:
    """An SGLang server inherits the trainer's environment: slime's DUMP_PHASE lists (slime's
    passes) must not stop it, a typo still does, and it prints no warning of the training side."""
    import importlib.util

    from rlprobe_patch.catalogue.releases import patches_dir

    path = patches_dir() / "_shared" / "inference_switches.py"
    spec = importlib.util.spec_from_file_location("inference_switches", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    methods = {k: v for k, v in vars(type(switches)).items() if k.startswith("_rlprobe")}
    methods["_rlprobe_switches"] = module.InferenceSwitches._rlprobe_switches
    reader = type("SGLangHook", (), methods)()
    for phase in ("", "log_prob", "ALL", "all,ref_forward", "log_prob, teacher_forward"):
        read = reader._rlprobe_switches({"DUMP_PHASE": phase, "PROMPTS_ONLY": "1"})
        assert read["warnings"] == [] and read["prompts_only"] is True, phase
    with pytest.raises(ValueError, match=r"DUMP_PHASE='all,ref_foward': ref_foward is not a pass"):
        reader._rlprobe_switches({"DUMP_PHASE": "all,ref_foward"})
    with pytest.raises(ValueError, match=r"DUMP_ON='yess'"):
        reader._rlprobe_switches({"DUMP_ON": "yess"})
