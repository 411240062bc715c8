"""Acceptance (issue 12): `script --mode consistency` on verl's own examples, checked by bash and Hydra.

For every example that trains with FSDP or Megatron and rolls out with vLLM or SGLang (the truth
from tests/script_oracle.py), `script` either writes a collection script or refuses for a reason
that is true of the script. A refusal names the `--set` options that make the run derivable; with
them, `script` succeeds. Each derived script is then run by bash with recording launchers: it must
launch the original's arguments unchanged, followed by ours; Hydra must compose them with the
release's config; both sides' dump configs must be there; the GPU count and TP that the alignment
checks relied on must be what the run gets; and `check-script` must pass on it.
"""

from __future__ import annotations

import json
import shlex
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import msprobe_configs
from omegaconf import OmegaConf
from script_oracle import (
    CORPORA,
    EXAMPLES,
    corpus_truth,
    launched_env,
    main_config,
    printed_not_launched,
    run_in_checkout,
    run_recording_env,
    verl_root,
)

from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.cli import main

# The exhaustive leg's (`-m exhaustive`, .ci/run): too long for the README's test command (issue 35).
pytestmark = [pytest.mark.exhaustive, pytest.mark.skipif(not EXAMPLES.is_dir(), reason="no ../shared/upstream")]

# Configs that exist: check-script fails on a missing one (issue 35, item 4).
_, ACTOR_CONFIG, _, GENERATE_CONFIG, *_ = msprobe_configs(Path(tempfile.mkdtemp(prefix="rlprobe-corpus-configs-")))
DUMP_KEYS = {
    "vllm": "actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.dump_config_path",
    "sglang": "actor_rollout_ref.rollout.engine_kwargs.sglang.msprobe_dump_config",
}


def run(*args: str) -> tuple[int, dict[str, Any]]:
    result = CliRunner().invoke(main, [*args, "--json"], catch_exceptions=False)
    return result.exit_code, json.loads(result.stdout)


def derive(original: str, output: str, root: Path, sets: list[str]) -> tuple[int, dict[str, Any]]:
    extra = [arg for item in sets for arg in ("--set", item)]
    return run(
        "script", original, "--mode", "consistency", "--verl-root", str(root),
        "--actor-config", ACTOR_CONFIG, "--generate-config", GENERATE_CONFIG, "-o", output, "--force", *extra,
    )  # fmt: skip


def true_refusal(detail: str, facts: dict[str, Any], values: dict[str, Any]) -> bool:
    """Is the refusal's reason true of what bash + Hydra say the script runs?"""
    world = values["n_gpus_per_node"] * values["nnodes"]
    if detail.startswith("FSDP: rollout TP must equal"):
        return facts["rollout_tp"] != world
    if detail.startswith("Megatron: TP must be equal"):
        return len({facts["actor_tp"], facts["rollout_tp"], values["ref_tp"]}) > 1
    if detail.startswith("Megatron: pipeline parallelism must be 1") or detail.startswith("Megatron: PP must"):
        return values["actor_pp"] != 1 or values["ref_pp"] != 1
    if detail.startswith("Megatron: EP must be equal"):
        return len({values["actor_ep"], values["ref_ep"], values["rollout_ep"]}) > 1
    if detail.startswith("vLLM rollout with pipeline parallelism"):
        return values["rollout_pp"] > 1
    return False


def select(config: Any, key: str, default: Any = None) -> Any:
    value = OmegaConf.select(config, key, default=default)
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def run_values(config: Any) -> dict[str, Any]:
    actor, ref, rollout = "actor_rollout_ref.actor", "actor_rollout_ref.ref", "actor_rollout_ref.rollout"
    return {
        "n_gpus_per_node": select(config, "trainer.n_gpus_per_node"),
        "nnodes": select(config, "trainer.nnodes"),
        "ref_tp": select(config, f"{ref}.megatron.tensor_model_parallel_size", 1),
        "actor_pp": select(config, f"{actor}.megatron.pipeline_model_parallel_size", 1),
        "ref_pp": select(config, f"{ref}.megatron.pipeline_model_parallel_size", 1),
        "actor_ep": select(config, f"{actor}.megatron.expert_model_parallel_size", 1),
        "ref_ep": select(config, f"{ref}.megatron.expert_model_parallel_size", 1),
        "rollout_ep": select(config, f"{rollout}.expert_parallel_size", 1),
        "rollout_pp": select(config, f"{rollout}.pipeline_model_parallel_size", 1),
    }


SHARDS = 3  # per corpus: the examples are split so that pytest-xdist spreads them over its workers


@pytest.mark.parametrize("shard", range(SHARDS))
@pytest.mark.parametrize("corpus", sorted(CORPORA))
def test_every_example_gets_a_collection_script(
    corpus: str, shard: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = verl_root(CORPORA[corpus])
    repo = tmp_path / "verl"
    shutil.copytree(EXAMPLES / corpus / "examples", repo / "examples", symlinks=True)
    (repo / "verl").symlink_to(root / "verl")
    monkeypatch.chdir(repo)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    cases = [
        t
        for t in corpus_truth(corpus)
        if t.composes
        and t.main is not None
        and t.main.facts["train_backend"] in ("fsdp", "fsdp2", "megatron")
        and t.main.facts["rollout_backend"] in ("vllm", "sglang")
    ]
    assert len(cases) > 40, f"{corpus}: only {len(cases)} fsdp/megatron x vllm/sglang examples"
    cases = cases[shard::SHARDS]
    problems: list[str] = []
    derived_count = refused_first = 0
    for truth in cases:
        assert truth.main is not None
        original = f"examples/{truth.script}"
        output = original.removesuffix(".sh") + ".consistency.sh"
        configs: list[Any] = []  # each launch's composed config, from the run itself (no second compose)
        ran = run_in_checkout(repo, original, root, configs)  # the original, run where the derived one will run
        here = ran.main
        assert here is not None and not here.error, f"{truth.script}: {here}"
        original_config = main_config(ran, configs)
        code, out = derive(original, output, root, [])
        if code == ExitCode.REFUSED:
            refused_first += 1
            false = [
                d for d in out.get("details", []) if not true_refusal(d, truth.main.facts, run_values(original_config))
            ]
            if false:
                problems.append(f"{truth.script}: refused for reasons not true of it: {false}")
                continue
            hint = out.get("hint", "")
            assert ", run: rlprobe-patch script " in hint, f"{truth.script}: refusal without a way forward: {out}"
            command = shlex.split(hint.split(", run: ", 1)[1])  # issue 29: a command that works as printed
            assert "--set" in command and command[2] == original, command
            code, out = run(*command[1:])
        if code != ExitCode.OK:
            problems.append(f"{truth.script}: script exit {code}: {out.get('message')} {out.get('details')}")
            continue
        derived_count += 1
        assumed = {**out["env"], **out["pinned_env"], **out["pinned_probes"]}
        before: Any = here
        for attempt in range(2):  # both runs in the same minute (some examples name runs with `date +%H%M`)
            if attempt:
                before = run_in_checkout(repo, original, root).main
            configs = []
            derived = run_recording_env(repo, output, root, list(assumed), configs)
            main_launch = derived.main
            assert before is not None
            if main_launch is None or main_launch.args[: len(before.args)] == before.args:
                break
        if main_launch is None or main_launch.error:
            problems.append(f"{truth.script}: the derived script does not compose: {main_launch and main_launch.error}")
            continue
        if main_launch.args[: len(before.args)] != before.args:
            problems.append(f"{truth.script}: the derived launch does not start with the original's arguments")
            continue
        if unlaunched := printed_not_launched(out["changes"], main_launch.args):  # issue 29: runs what was checked
            problems.append(f"{truth.script}: the derived launch is not what script printed: {unlaunched}")
            continue
        env = launched_env(derived.calls)
        if unset := [f"${n}: assumed {v!r}, at launch {env.get(n)!r}" for n, v in assumed.items() if env.get(n) != v]:
            problems.append(f"{truth.script}: {unset}")
            continue
        config = main_config(derived, configs)
        rollout = main_launch.facts["rollout_backend"]
        values = run_values(config)
        world = values["n_gpus_per_node"] * values["nnodes"]
        wrong = []
        if select(config, DUMP_KEYS[rollout]) != GENERATE_CONFIG:
            wrong.append(f"rollout dump config {DUMP_KEYS[rollout]} missing")
        if main_launch.facts["train_backend"] in ("fsdp", "fsdp2") and main_launch.facts["rollout_tp"] != world:
            wrong.append(f"FSDP: rollout TP {main_launch.facts['rollout_tp']} != {world} GPUs")
        if main_launch.facts["train_backend"] == "megatron" and (
            main_launch.facts["actor_tp"] != main_launch.facts["rollout_tp"] or values["actor_pp"] != 1
        ):
            wrong.append(f"Megatron: TP {main_launch.facts} / PP {values['actor_pp']} not aligned")
        if select(config, "data.train_batch_size") != 1 or select(config, "trainer.total_training_steps") != 1:
            wrong.append("batch size / steps not 1")
        if wrong:
            problems.append(f"{truth.script}: {wrong}")
            continue
        assert out["next"][:3] == ["rlprobe-patch", "check-script", output], out["next"]
        code, checked = run(*out["next"][1:])  # the next: line, as printed
        if code != ExitCode.OK:
            failed = [c for c in checked.get("checks", []) if not c["ok"]] or checked
            problems.append(f"{truth.script}: check-script on the derived script: {failed}")
    print(f"{corpus} shard {shard}: {len(cases)} examples, {refused_first} refused first, {derived_count} derived")
    assert not problems, "\n".join(problems)
    assert derived_count == len(cases)
