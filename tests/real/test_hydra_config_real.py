"""Piece of issue 12: Hydra decides the values (rlprobe_patch.launch.hydra_compose), on real releases.

Hydra composes each real release's own config; the fast part: tests/unit/test_hydra_config.py.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from conftest import VERL_RELEASES, hydra_args
from script_oracle import verl_root

from rlprobe_patch.launch.hydra_compose import compose_launch, release_defaults, release_defaults_path


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


def test_overrides_groups_and_sources() -> None:
    root = verl_root("0.8.0")
    composed = compose_launch(
        root,
        "verl.trainer.main_ppo",
        hydra_args(
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


def test_relative_config_path_is_relative_to_the_entry_point() -> None:
    """`--config-path=config` under `python3 -m verl.trainer.main_ppo` is verl/trainer/config."""
    root = verl_root("0.6.1")
    composed = compose_launch(
        root,
        "verl.trainer.main_ppo",
        hydra_args("--config-path=config", "--config-name=ppo_megatron_trainer.yaml"),
        cwd=Path("/"),
    )
    assert not composed.errors
    assert composed.facts["train_backend"].value == "megatron"
    assert composed.facts["train_backend"].source == "ppo_megatron_trainer.yaml (run.sh:2)"


def test_hydra_errors_name_the_override_at_fault(capsys: pytest.CaptureFixture[str]) -> None:
    root = verl_root("0.8.0")
    before = os.getcwd()
    composed = compose_launch(
        root,
        "verl.trainer.main_ppo",
        hydra_args("trainer.nnodes=2", "actor_rollout_ref.actor.model_engine=megatron", "trainer.n_gpus_per_node=4"),
        cwd=Path("/"),
    )
    assert composed.config is None and len(composed.errors) == 1
    assert composed.errors[0].startswith("run.sh:2: actor_rollout_ref.actor.model_engine=megatron: Could not override")
    bad_group = compose_launch(root, "verl.trainer.main_ppo", hydra_args("model_engine=nope"), cwd=Path("/"))
    assert "run.sh:1" in bad_group.errors[0] and "model_engine/nope" in bad_group.errors[0]
    assert os.getcwd() == before
    assert capsys.readouterr().out == ""
    from hydra.core.global_hydra import GlobalHydra

    assert not GlobalHydra.instance().is_initialized()


def test_non_ppo_entry_points_are_reported() -> None:
    composed = compose_launch(verl_root("0.8.0"), "verl.trainer.sft_trainer", [], cwd=Path.cwd())
    assert not composed.ppo and "not a PPO trainer" in composed.notes[0]
    assert "train_backend" not in composed.facts


def test_each_config_file_is_parsed_once_until_it_changes(tmp_path: Path) -> None:
    """The compose memo (each file Hydra loads kept once per process, each compose given its own copy; each
    interpolation parsed once) gives what plain Hydra gives, resolved or not, composed again with other overrides
    (a group swapped, a value of a loaded file changed, which must not reach the next compose), and an edited
    file is read again: compose, edit ppo_trainer.yaml, compose."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    root = tmp_path / "verl"
    shutil.copytree(verl_root("0.8.0") / "verl", root / "verl")
    config_dir = root / "verl" / "trainer" / "config"
    first_overrides = ["trainer.total_epochs=3"]
    second_overrides = ["model_engine=megatron", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4"]

    def plain(overrides: list[str], resolve: bool) -> object:
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            config = compose(config_name="ppo_trainer", overrides=overrides)
        GlobalHydra.instance().clear()
        return OmegaConf.to_container(config, resolve=resolve)

    def ours(overrides: list[str], resolve: bool) -> object:
        composed = compose_launch(root, "verl.trainer.main_ppo", hydra_args(*overrides), cwd=tmp_path)
        assert not composed.errors
        return OmegaConf.to_container(composed.config, resolve=resolve)

    first = ours(first_overrides, False)
    assert ours(first_overrides, False) == first == plain(first_overrides, False)
    second = ours(second_overrides, True)
    assert second == plain(second_overrides, True) and second != ours(first_overrides, True)
    assert second["actor_rollout_ref"]["actor"]["megatron"]["tensor_model_parallel_size"] == 4  # type: ignore[index]
    assert ours(first_overrides, True) == plain(first_overrides, True)
    trainer = config_dir / "ppo_trainer.yaml"
    text = trainer.read_text(encoding="utf-8")
    assert "  project_name: verl_examples\n" in text
    trainer.write_text(text.replace("  project_name: verl_examples\n", "  project_name: edited\n"), encoding="utf-8")
    again = ours(first_overrides, False)
    assert again["trainer"]["project_name"] == "edited" and again == plain(first_overrides, False)  # type: ignore[index]


def test_the_oracles_load_memo_composes_what_plain_hydra_does(tmp_path: Path) -> None:
    """tests/script_oracle.py's memo (each config file's text loaded by OmegaConf once per process, every load a deep
    copy) composes what plain Hydra composes: twice the same launch, then a group swap, then the first again."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf
    from script_oracle import compose_config

    root = verl_root("0.8.0")
    config_dir = root / "verl" / "trainer" / "config"
    first = ["trainer.total_epochs=3", "actor_rollout_ref.rollout.name=sglang"]
    second = ["model_engine=megatron", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4"]

    def plain(overrides: list[str]) -> object:
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            config = compose(config_name="ppo_trainer", overrides=overrides)
        GlobalHydra.instance().clear()
        return OmegaConf.to_container(config, resolve=True)

    def oracle(overrides: list[str]) -> object:
        return OmegaConf.to_container(compose_config("verl.trainer.main_ppo", overrides, root, tmp_path), resolve=True)

    assert oracle(first) == oracle(first) == plain(first)
    assert oracle(second) == plain(second) != plain(first)
    assert oracle(first) == plain(first)
