"""`apply`'s file list on real releases: each file once (issue 29, item 9).

verl 0.9.1's `verl.request-id` hooks two places of `verl/workers/rollout/llm_server.py`; the plan listed
the file once per site, so `apply` printed `llm_server.py, llm_server.py`."""

from __future__ import annotations

from collections import Counter

import pytest
from conftest import cli, cli_json

from rlprobe_patch.catalogue.releases import releases


@pytest.mark.parametrize("release", releases("verl").tested)
def test_every_file_is_listed_once(release: str, real_tree) -> None:
    root = real_tree(release)
    args = ("apply", "--verl-root", str(root), "--mode", "consistency", "--backend", "fsdp", "--dry-run")
    code, out = cli_json(*args)
    assert code == 0, out
    sites = Counter(target for patch in out["patches"] for target in patch["targets"])
    for patch in out["patches"]:
        assert len(patch["targets"]) == len(set(patch["targets"])), patch
    text = cli(*args).stdout
    listed = [line.split(None, 3)[-1].split(", ") for line in text.splitlines() if line.startswith("  verl.")]
    assert len(listed) == len(out["patches"]), text
    for files in listed:
        assert len(files) == len(set(files)), files
    assert sites, out
