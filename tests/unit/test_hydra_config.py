"""Piece of issue 12: Hydra decides the values (rlprobe_patch.launch.hydra_compose).

The fast part: argument splitting and the catalogue's defaults without a tree. Hydra composing
real releases: tests/real/test_hydra_config_real.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
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
    launch = parse_hydra_args(hydra_args("--config-path=cfg", "-cn", "mine", "--multirun", "a.b=1", "+c=2"))
    assert launch.config_path == Arg("cfg", "run.sh:1")
    assert launch.config_name == Arg("mine", "run.sh:3")
    assert [a.text for a in launch.overrides] == ["a.b=1", "+c=2"]
    assert [a.source for a in launch.overrides] == ["run.sh:5", "run.sh:6"]
    # Hydra takes its overrides in one run: more after a flag that follows them are refused, as Hydra refuses them
    refused = parse_hydra_args(hydra_args("a.b=1", "--multirun", "+c=2"))
    assert refused.error == "Hydra's command line: unrecognized arguments: +c=2"
    assert override_key("++a.b=1") == "a.b" and override_key("~a.b") == "a.b"


@pytest.mark.parametrize(
    "argv",
    [
        ["--cfg", "job", "a.b=1"],  # issue 44: `job` is --cfg's value, not an override
        ["-c", "hydra", "trainer.n_gpus_per_node=8"],
        ["--cfg=all", "--resolve", "a=1"],
        ["-sc", "a=1"],  # --shell-completion takes no value: a=1 is an override
        ["--shell-completion", "--multirun", "+b=2", "c=3"],
        ["--info", "--config-name", "mine", "a=1"],  # --info's value is optional
        ["--info", "searchpath", "a=1"],
        ["-p", "pkg", "-cd", "/extra", "--config-path", "/cfg", "x=1", "~y"],
        ["--experimental-rerun", "run.pickle", "z=1"],
        ["-m", "--run", "-cn=other", "a=1", "a=2"],
    ],
)
def test_hydra_flags_are_split_as_hydra_splits_them(argv: list[str]) -> None:
    """Hydra's own parser is the oracle: the overrides, --config-path and --config-name it reads from the launch's
    words, each keeping where it was written."""
    from hydra._internal.utils import get_args_parser

    hydra = get_args_parser().parse_args(argv)
    args = hydra_args(*argv)
    launch = parse_hydra_args(args)
    assert [a.text for a in launch.overrides] == hydra.overrides
    assert all(a in args for a in launch.overrides)  # the words themselves, with their lines
    assert (launch.config_path.text if launch.config_path else None) == hydra.config_path
    assert (launch.config_name.text if launch.config_name else None) == hydra.config_name


def test_a_command_line_hydra_refuses_is_an_error_of_the_launch() -> None:
    launch = parse_hydra_args(hydra_args("--cfg", "everything", "a=1"))
    assert launch.error is not None and "--cfg" in launch.error and "everything" in launch.error
    composed = compose_launch(None, "verl.trainer.main_ppo", hydra_args("--cfg", "everything"), cwd=Path.cwd())
    assert composed.errors and "invalid choice" in composed.errors[0]


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
