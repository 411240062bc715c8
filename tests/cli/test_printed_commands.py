"""Issue 29, item 3: every `next:` / `hint:` line that names an rlprobe-patch command works as printed.

`script` is run on each of the tool's own workflow fixtures in every mode, in text mode as a user
reads it; each command a `next:` or `hint:` line prints is run exactly as printed (from the same
directory), and so is the `next:` line of what that prints, until no command is left. Each must
succeed. The corpus scripts get the same treatment in tests/real/test_script_corpus_derive.py (the
`--set` refusal's command and the `next:` check-script line, run as printed).
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from conftest import WORKFLOW_SCRIPTS, cli, msprobe_configs
from printed import printed_commands

from rlprobe_patch.base.errors import ExitCode


@pytest.mark.parametrize("mode", ["consistency", "inference", "training"])
@pytest.mark.parametrize("name", sorted(p.name for p in WORKFLOW_SCRIPTS.glob("*.sh")))
def test_every_printed_command_works_as_printed(
    name: str, mode: str, workflow_scripts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(workflow_scripts)
    configs = msprobe_configs(workflow_scripts / "configs", mode, "sglang" if "sglang" in name else "vllm")
    first = cli("script", name, "--mode", mode, *configs, "-o", f"out-{mode}.sh")
    pending = printed_commands(first.output)
    assert pending or first.exit_code != ExitCode.OK, first.output  # a derived script always says what is next
    if "--set" in first.output and first.exit_code == ExitCode.REFUSED:
        assert pending, first.output  # a refusal that names --set values prints the whole command
    ran = []
    while pending:
        command = pending.pop(0)
        assert command[0] == "rlprobe-patch", command
        result = cli(*command[1:])
        assert result.exit_code == ExitCode.OK, (shlex.join(command), result.output)
        ran.append(command[1])
        pending += printed_commands(result.output)
        assert len(ran) < 5, ran
    if first.exit_code != ExitCode.OK and ran:
        assert ran[0] == "script" and "check-script" in ran  # the refusal's command derived, then checked
