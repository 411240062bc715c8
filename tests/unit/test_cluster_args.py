"""cli/cluster.py: the local command each node runs is built from the same options the local
commands take (`Roots`, the apply options): every option given reaches the nodes, spelt as the
local command spells it."""

from __future__ import annotations

from pathlib import Path

from rlprobe_patch.cli.cluster import option_args, tree_args
from rlprobe_patch.core.roots import Roots


def test_tree_args_carry_every_root_the_python_and_trust_record() -> None:
    roots = Roots({"verl": Path("/v"), "slime": Path("/s")}, "/env/bin/python", trust_record=True)
    assert tree_args(roots) == [
        "--python", "/env/bin/python", "--verl-root", "/v", "--slime-root", "/s", "--trust-record",
    ]  # fmt: skip
    assert tree_args(Roots({})) == []


def test_option_args_spell_flags_as_the_local_command_does() -> None:
    args = option_args(
        {"only": "a,b", "worker_impl": "auto", "force": True, "dry_run": False, "script": Path("/r.sh"), "mode": None}
    )
    assert args == ["--only", "a,b", "--worker-impl", "auto", "--force", "--script", "/r.sh"]
