"""Acceptance (issue 29, items 1 and 3): derived scripts run what was checked, in every mode.

The scripts swept: those of both shared corpora that launch a PPO trainer with a vLLM or SGLang
rollout (and compose as they are). In inference mode every one of them, as it is and once per
choice it reads: with the `--python` that finds `torch_npu`, with `--env INFER_BACKEND=sglang`. In
consistency and training mode (from verl 0.8) every one that reads such a choice, once per choice.
Every script as it is (neither choice) is derived in those two modes, with the same checks, by
tests/real/test_script_corpus_derive.py (consistency, both corpora) and
tests/real/test_script_corpus_training.py (training, every v0.8.0 example); a derivation costs
about two Hydra composes, so the sweep does not repeat them. A refusal's printed command is run as
printed. Each derived script is then run by bash with the recording launchers of
tests/script_oracle.py, every launcher also recording the environment it starts with:

- the launched overrides are the ones `script` printed as set or added (each key's last value on the
  command line);
- every value the derivation assumed is in force at the launch: the `--env` pins, the import
  probes' answers (`DEVICE=npu`, answered by a `--python` that finds `torch_npu`, though the
  recording `python3 -c` fails) and the switches `script` exports; a pin asked for is reported;
- the rollout engine bash + Hydra launch is the one whose dump config was added.

The scripts of a corpus and mode are split into shards, so that pytest-xdist spreads them over its workers.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import CONFIG_FILES
from omegaconf import OmegaConf
from script_oracle import (
    CORPORA,
    EXAMPLES,
    corpus_truth,
    launched_env,
    main_config,
    printed_not_launched,
    run_recording_env,
    verl_root,
)

from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.cli import main

# The exhaustive leg's (`-m exhaustive`, .ci/run): too long for the README's test command (issue 35).
pytestmark = [pytest.mark.exhaustive, pytest.mark.skipif(not EXAMPLES.is_dir(), reason="no ../shared/upstream")]

SHARDS = {"inference": 3, "consistency": 2, "training": 2}  # per corpus: spread over pytest-xdist's workers
# configs that exist (script refuses one that does not), written with config's rules
GENERATE = str(CONFIG_FILES / "config_generate.json")
CONFIGS = (
    "--actor-config",
    str(CONFIG_FILES / "config_actor.json"),
    "--generate-config",
    GENERATE,
    "--training-config",
    str(CONFIG_FILES / "config_training.json"),
)
DUMP_KEYS = {
    "vllm": "actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.dump_config_path",
    "sglang": "actor_rollout_ref.rollout.engine_kwargs.sglang.msprobe_dump_config",
}


def run(*args: str) -> tuple[int, dict[str, Any]]:
    result = CliRunner().invoke(main, [*args, "--json"], catch_exceptions=False)
    return result.exit_code, json.loads(result.stdout)


def modes(release: str) -> list[str]:
    return ["consistency", "inference"] + (["training"] if release >= "0.8" else [])


def choices(text: str, npu_python: str) -> list[list[str]]:
    """The options that answer each choice a script reads (an import probe, `INFER_BACKEND`)."""
    found = [["--python", npu_python]] if "python3 -c 'import torch_npu'" in text else []
    return found + ([["--env", "INFER_BACKEND=sglang"]] if "INFER_BACKEND" in text else [])


def reads_choice(corpus: str, script: str) -> bool:
    return bool(choices((EXAMPLES / corpus / "examples" / script).read_text(), ""))


def swept(corpus: str, mode: str) -> list[Any]:
    """The scripts swept in `mode` (the module's docstring says which)."""
    truths = [t for t in corpus_truth(corpus) if t.composes and t.main is not None and "ppo" in t.main.entry]
    truths = [t for t in truths if t.main.facts["rollout_backend"] in ("vllm", "sglang")]  # type: ignore[union-attr]
    if mode != "inference":
        truths = [t for t in truths if reads_choice(corpus, t.script)]
    return sorted(truths, key=lambda t: t.script)


def any_choice(corpus: str) -> bool:
    """Does any script of the corpus read a choice (v0.6.1: none)?"""
    folder = EXAMPLES / corpus / "examples"
    return any(reads_choice(corpus, p.relative_to(folder).as_posix()) for p in folder.rglob("*.sh"))


CASES = [
    pytest.param(corpus, mode, shard, id=f"{corpus}-{mode}-{shard}")
    for corpus, release in sorted(CORPORA.items())
    for mode in modes(release)
    if EXAMPLES.is_dir() and (mode == "inference" or any_choice(corpus))
    for shard in range(SHARDS[mode])
]


@pytest.fixture
def npu_python(tmp_path: Path) -> str:
    """An interpreter that finds `torch_npu` (an empty package on its path): the probe's answer is npu."""
    (tmp_path / "npu" / "torch_npu").mkdir(parents=True)
    (tmp_path / "npu" / "torch_npu" / "__init__.py").write_text("")
    wrapper = tmp_path / "npu" / "python"
    wrapper.write_text(f'#!/bin/bash\nPYTHONPATH={tmp_path / "npu"} exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def derive(original: str, output: str, root: Path, mode: str, extra: list[str]) -> tuple[int, dict[str, Any]]:
    args = ["script", original, "--mode", mode, "--verl-root", str(root), *CONFIGS, "-o", output, "--force", *extra]
    code, out = run(*args)
    if code == ExitCode.REFUSED and ", run: rlprobe-patch script " in out.get("hint", ""):
        command = shlex.split(out["hint"].split(", run: ", 1)[1])  # the refusal's command, as printed
        code, out = run(*command[1:])
    return code, out


@pytest.mark.parametrize(("corpus", "mode", "shard"), CASES)
def test_derived_scripts_run_what_was_checked(
    corpus: str, mode: str, shard: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, npu_python: str
) -> None:
    release = CORPORA[corpus]
    cases = swept(corpus, mode)[shard :: SHARDS[mode]]
    root = verl_root(release)
    repo = tmp_path / "verl"
    shutil.copytree(EXAMPLES / corpus / "examples", repo / "examples", symlinks=True)
    (repo / "verl").symlink_to(root / "verl")
    monkeypatch.chdir(repo)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    problems: list[str] = []
    counts = {"scripts": len(cases), "derivations": 0, "derived": 0, "refused": 0, "pins": 0}
    for truth in cases:
        original = f"examples/{truth.script}"
        text = (repo / original).read_text()
        variants = choices(text, npu_python)  # once per choice it reads; in inference mode also as it is
        for extra in [[]] + variants if mode == "inference" else variants:
            name = f"{truth.script} {mode} {' '.join(extra)}".strip()
            output = "examples/derived.sh"
            counts["derivations"] += 1
            code, out = derive(original, output, root, mode, extra)
            if code == ExitCode.REFUSED and not any("--set" in d or "GPU" in d for d in out.get("details", [])):
                counts["refused"] += 1  # refused for what no option changes (e.g. a stage this release lacks)
                continue
            if code != ExitCode.OK:
                problems.append(f"{name}: exit {code}: {out.get('message')} {out.get('details')}")
                continue
            counts["derived"] += 1
            wrong: list[str] = []
            if extra[:1] == ["--env"] and not out["pinned_env"]:
                wrong.append(f"{extra[1]} asked for, no pinned_env reported")
            if extra[:1] == ["--python"] and not out["pinned_probes"]:
                wrong.append("the import probe's answer is not pinned")
            counts["pins"] += bool(out["pinned_env"] or out["pinned_probes"])
            assumed = {**out["env"], **out["pinned_env"], **out["pinned_probes"]}
            configs: list[Any] = []
            recorded = run_recording_env(repo, output, root, list(assumed), configs)
            launch = recorded.main
            if launch is None or launch.error:
                problems.append(f"{name}: the derived script does not compose: {launch and launch.error}")
                continue
            wrong += printed_not_launched(out["changes"], launch.args)
            env = launched_env(recorded.calls)
            wrong += [f"${n}: assumed {v!r}, at launch {env.get(n)!r}" for n, v in assumed.items() if env.get(n) != v]
            config = main_config(recorded, configs)
            engine = OmegaConf.select(config, "actor_rollout_ref.rollout.name")
            if engine != out["rollout_backend"]:
                wrong.append(f"rollout {engine} launched, {out['rollout_backend']} derived")
            if mode != "training" and OmegaConf.select(config, DUMP_KEYS[str(engine)]) != GENERATE:
                wrong.append(f"no dump config for the {engine} rollout launched")
            if wrong:
                problems.append(f"{name}: {wrong}")
    print(f"{corpus} {mode} shard {shard}: {counts}")
    assert cases, f"no script of {corpus} in shard {shard}"
    assert not problems, "\n".join(problems)
    # Refused only for what no option changes, and never most of them: the sweep checks derivations.
    assert counts["derived"] + counts["refused"] == counts["derivations"], counts
    assert counts["derived"] > counts["refused"], counts
