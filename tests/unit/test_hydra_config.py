"""Piece of issue 12: Hydra decides the values (rlprobe_patch.launch.hydra_compose).

The fast part: argument splitting and the catalogue's defaults without a tree. Hydra composing
real releases: tests/real/test_hydra_config_real.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

from conftest import VERL_RELEASES, hydra_args

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


def test_hydra_flags_are_split_from_overrides() -> None:
    launch = parse_hydra_args(hydra_args("--config-path=cfg", "-cn", "mine", "a.b=1", "--multirun", "+c=2"))
    assert launch.config_path == Arg("cfg", "run.sh:1")
    assert launch.config_name == Arg("mine", "run.sh:3")
    assert [a.text for a in launch.overrides] == ["a.b=1", "+c=2"]
    assert override_key("++a.b=1") == "a.b" and override_key("~a.b") == "a.b"


def test_without_a_tree_the_catalogue_defaults_are_assumed() -> None:
    composed = compose_launch(
        None, "verl.trainer.main_ppo", hydra_args("model_engine=megatron"), cwd=Path.cwd(), release="0.8.0"
    )
    assert composed.assumed and composed.config is None
    assert composed.facts["train_backend"].value == "megatron"
    assert composed.facts["train_backend"].source == "run.sh:1"
    assert composed.facts["rollout_tp"].source == "assumed: verl 0.8.0 default (catalogue)"
    assert "use_v1" not in composed.facts
    assert compose_launch(None, "m", [], cwd=Path.cwd(), release="0.9.1").facts["use_v1"].value is True


def test_catalogue_covers_every_tested_release() -> None:
    data = tomllib.loads(release_defaults_path().read_text(encoding="utf-8"))
    assert release_defaults(data["assume_when_unknown"]) is not None
    assert all(release_defaults(release) for release in VERL_RELEASES)
