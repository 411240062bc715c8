"""The diagnosis' confirming runs (`[[diagnosis_confirm]]` in patches/releases/verl.toml) against the real
releases: each `set` key is in the rollout config verl ships (verl/trainer/config/rollout/rollout.yaml of the
wheel) in exactly the tested releases its `versions` names, so a printed `script --set` line is one the run's
verl takes."""

from __future__ import annotations

import zipfile

import yaml
from conftest import VERL_RELEASES, verl_wheel
from packaging.version import Version

from rlprobe_patch.catalogue.releases import releases

PREFIX = "actor_rollout_ref.rollout."


def _has(config: dict, dotted: str) -> bool:
    node: object = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def test_each_confirming_key_is_in_the_rollout_config_of_the_releases_it_names() -> None:
    confirms = releases("verl").confirms
    assert confirms
    seen = {}
    for release in VERL_RELEASES:
        with zipfile.ZipFile(verl_wheel(release)) as wheel:
            config = yaml.safe_load(wheel.read("verl/trainer/config/rollout/rollout.yaml"))
        for confirm in confirms:
            key = confirm.set.partition("=")[0]
            assert key.startswith(PREFIX), confirm
            named = Version(release) in confirm.versions
            seen[(key, release)] = _has(config, key.removeprefix(PREFIX))
            assert seen[(key, release)] == named, (release, confirm.set, str(confirm.versions))
    # the one key that came later: logprobs_mode from 0.7.0 (what `versions` exists for)
    assert not seen[(PREFIX + "logprobs_mode", "0.6.1")] and seen[(PREFIX + "logprobs_mode", "0.7.0")]
