"""Piece of issue 12: Hydra decides the values (rlprobe_patch.launch.hydra_compose)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from conftest import VERL_RELEASES
from script_oracle import verl_root

from rlprobe_patch.launch.hydra_compose import (
    Arg,
    compose_launch,
    override_key,
    parse_hydra_args,
    release_defaults,
    release_defaults_path,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib


def args(*texts: str) -> list[Arg]:
    return [Arg(text, f"run.sh:{i + 1}") for i, text in enumerate(texts)]


def test_hydra_flags_are_split_from_overrides() -> None:
    launch = parse_hydra_args(args("--config-path=cfg", "-cn", "mine", "a.b=1", "--multirun", "+c=2"))
    assert launch.config_path == Arg("cfg", "run.sh:1")
    assert launch.config_name == Arg("mine", "run.sh:3")
    assert [a.text for a in launch.overrides] == ["a.b=1", "+c=2"]
    assert override_key("++a.b=1") == "a.b" and override_key("~a.b") == "a.b"


def test_without_a_tree_the_catalogue_defaults_are_assumed() -> None:
    composed = compose_launch(
        None, "verl.trainer.main_ppo", args("model_engine=megatron"), cwd=Path.cwd(), release="0.8.0"
    )
    assert composed.assumed and composed.config is None
    assert composed.facts["train_backend"].value == "megatron"
    assert composed.facts["train_backend"].source == "run.sh:1"
    assert composed.facts["rollout_tp"].source == "assumed: verl 0.8.0 default (catalogue)"
    assert "use_v1" not in composed.facts
    assert compose_launch(None, "m", [], cwd=Path.cwd(), release="0.9.1").facts["use_v1"].value is True


@pytest.mark.real
@pytest.mark.parametrize("release", VERL_RELEASES)
def test_catalogue_defaults_match_hydra(release: str) -> None:
    """Each key the catalogue keeps for a release is what Hydra composes from its ppo_trainer.yaml;
    a key it leaves out has no value there (unset or absent)."""
    found = release_defaults(release)
    assert found is not None, f"{release_defaults_path()} has no entry for verl {release}"
    _, defaults = found
    composed = compose_launch(verl_root(release), "verl.trainer.main_ppo", [], cwd=Path.cwd())
    assert not composed.errors
    real = {key: fact.value for key, fact in composed.facts.items()}
    assert {key: real.get(key) for key in defaults} == defaults
    for key in ("train_backend", "rollout_backend", "use_legacy_worker_impl", "use_v1", "actor_tp", "rollout_tp"):
        assert (key in defaults) == (real.get(key) is not None), key
    assert all(f.source == "verl default (ppo_trainer.yaml)" for f in composed.facts.values())


def test_catalogue_covers_every_tested_release() -> None:
    data = tomllib.loads(release_defaults_path().read_text(encoding="utf-8"))
    assert release_defaults(data["assume_when_unknown"]) is not None
    assert all(release_defaults(release) for release in VERL_RELEASES)


@pytest.mark.real
def test_overrides_groups_and_sources() -> None:
    root = verl_root("0.8.0")
    composed = compose_launch(
        root,
        "verl.trainer.main_ppo",
        args(
            "model_engine=megatron",
            "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4",
            "actor_rollout_ref.rollout.name=sglang",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=8",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=4",
        ),
        cwd=Path.cwd(),
    )
    facts = composed.facts
    assert not composed.errors
    assert (facts["train_backend"].value, facts["train_backend"].source) == ("megatron", "run.sh:1")
    assert (facts["actor_tp"].value, facts["actor_tp"].source) == (4, "run.sh:2")
    assert facts["ref_tp"].value == 4  # ${oc.select:...actor...} followed to the override that set it
    assert facts["ref_tp"].source == "run.sh:2"
    assert (facts["rollout_backend"].value, facts["rollout_backend"].source) == ("sglang", "run.sh:3")
    assert (facts["rollout_tp"].value, facts["rollout_tp"].source) == (4, "run.sh:5")
    assert facts["nnodes"].source == "verl default (ppo_trainer.yaml)"


@pytest.mark.real
def test_relative_config_path_is_relative_to_the_entry_point() -> None:
    """`--config-path=config` under `python3 -m verl.trainer.main_ppo` is verl/trainer/config."""
    root = verl_root("0.6.1")
    composed = compose_launch(
        root,
        "verl.trainer.main_ppo",
        args("--config-path=config", "--config-name=ppo_megatron_trainer.yaml"),
        cwd=Path("/"),
    )
    assert not composed.errors
    assert composed.facts["train_backend"].value == "megatron"
    assert composed.facts["train_backend"].source == "ppo_megatron_trainer.yaml (run.sh:2)"


@pytest.mark.real
def test_hydra_errors_name_the_override_at_fault(capsys: pytest.CaptureFixture[str]) -> None:
    root = verl_root("0.8.0")
    before = os.getcwd()
    composed = compose_launch(
        root,
        "verl.trainer.main_ppo",
        args("trainer.nnodes=2", "actor_rollout_ref.actor.model_engine=megatron", "trainer.n_gpus_per_node=4"),
        cwd=Path("/"),
    )
    assert composed.config is None and len(composed.errors) == 1
    assert composed.errors[0].startswith("run.sh:2: actor_rollout_ref.actor.model_engine=megatron: Could not override")
    bad_group = compose_launch(root, "verl.trainer.main_ppo", args("model_engine=nope"), cwd=Path("/"))
    assert "run.sh:1" in bad_group.errors[0] and "model_engine/nope" in bad_group.errors[0]
    assert os.getcwd() == before
    assert capsys.readouterr().out == ""
    from hydra.core.global_hydra import GlobalHydra

    assert not GlobalHydra.instance().is_initialized()


@pytest.mark.real
def test_non_ppo_entry_points_are_reported() -> None:
    composed = compose_launch(verl_root("0.8.0"), "verl.trainer.sft_trainer", [], cwd=Path.cwd())
    assert not composed.ppo and "not a PPO trainer" in composed.notes[0]
    assert "train_backend" not in composed.facts
