"""Issue 42, item 1: part of the consistency set applied (`apply --only`, the README's first step) on a real verl
release, and the `next:` verify apply prints, run as printed.

The skill's check-consistency-patch checks the whole set; verify had run it against the files of the patches
the user did not apply and failed (exit 4), listing paths without what is wrong. Now the rules of the patches
not applied are shown and do not fail verify; a rule of an applied patch that fails says what is missing.
"""

from __future__ import annotations

import pytest
from conftest import cli, cli_json
from printed import printed_commands

from rlprobe_patch.base.errors import ExitCode

ONLY = "verl.logprob-capture,verl.request-id"


def _skill_check(out: dict) -> dict:
    (tree,) = out["trees"]
    return next(c for c in tree["checks"] if c["check"].startswith("skill check-consistency-patch"))


@pytest.mark.parametrize("only", [ONLY, "verl.prompts-only,verl.request-id"])
def test_verify_as_apply_prints_it_after_part_of_the_set(real_tree, only: str) -> None:
    root = real_tree("0.9.1")
    applied = cli("apply", "--verl-root", root, "--backend", "fsdp", "--only", only)
    assert applied.exit_code == ExitCode.OK, applied.output
    (command,) = printed_commands(applied.output)
    assert command == ["rlprobe-patch", "verify", "--verl-root", str(root)]  # the tree patched, not every one
    verified = cli(*command[1:])
    assert verified.exit_code == ExitCode.OK, verified.output
    code, out = cli_json(*command[1:])
    skill = _skill_check(out)
    assert code == ExitCode.OK and skill["ok"] and "not applied: " in skill["detail"], skill
    for patch in only.split(","):
        assert patch not in skill["detail"].split("not applied: ")[1]


def test_a_rule_of_an_applied_patch_says_what_is_missing(real_tree) -> None:
    """verl.prompts-only applied, then its marker edited out of ray_trainer.py: the skill's rule fails verify,
    naming the file and the markers it lacks."""
    root = real_tree("0.9.1")
    assert (
        cli("apply", "--verl-root", root, "--backend", "fsdp", "--only", "verl.prompts-only,verl.request-id").exit_code
        == 0
    )
    target = root / "verl" / "trainer" / "ppo" / "ray_trainer.py"
    target.write_text(target.read_text().replace("compute_prompts_only", "compute_prompts_solely"))
    code, out = cli_json("verify", "--verl-root", root)
    skill = _skill_check(out)
    assert code == ExitCode.VERIFY_FAILED and not skill["ok"], skill
    assert f"{target} (missing markers: compute_prompts_only)" in skill["detail"], skill
