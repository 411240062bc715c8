"""Every command's path options given a path that cannot serve: a clear message and exit 3, never a traceback.

Four dead ends per option (issue 29): a folder that does not exist, a directory where a file is
wanted, a file where a directory is wanted, and a path that cannot be written. Each case runs the
command as a user would and checks the exit code, that the message names the path, and that no
traceback was printed (exit 1 is a bug: "internal error ... please report it").
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import CONFIGS, WORKFLOW_SCRIPTS

from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.cli import main

SCRIPT = "grpo_fsdp_vllm.sh"


def unwritable_dir(tmp_path: Path) -> Path:
    """A folder this process cannot create files in (root ignores modes: /sys refuses even root)."""
    if os.geteuid() == 0:
        return Path("/sys")
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o500)
    return folder


# (command line, the path it gets) with {script}, {dir}, {file}, {missing}, {unwritable} filled in;
# `{bad}` is the path under test.
CASES: dict[str, list[str]] = {
    # a file wanted, a folder that does not exist / a directory given
    "detect SCRIPT": ["detect", "{bad}", "--no-trees"],
    "script ORIGINAL": ["script", "{bad}", "--mode", "consistency", *CONFIGS, "--dry-run"],
    "check-script SCRIPT": ["check-script", "{bad}", "--mode", "consistency", *CONFIGS],
    "apply --script": ["apply", "--verl-root", "{tree}", "--backend", "fsdp", "--script", "{bad}", "--dry-run"],
    "verify --script": ["verify", "--verl-root", "{tree}", "--script", "{bad}"],
    # a file written
    "script -o": ["script", "{script}", "--mode", "consistency", *CONFIGS, "-o", "{bad}"],
    "config -o": [
        "config",
        "--mode",
        "inference",
        "--side",
        "generate",
        "--dump-path",
        "/d",
        "--no-check",
        "-o",
        "{bad}",
    ],
    # a directory wanted
    "apply --verl-root": ["apply", "--verl-root", "{bad}", "--backend", "fsdp", "--dry-run"],
    "verify --verl-root": ["verify", "--verl-root", "{bad}"],
    "status --verl-root": ["status", "--verl-root", "{bad}"],
    "revert --verl-root": ["revert", "--verl-root", "{bad}"],
    "detect --verl-root": ["detect", "{script}", "--verl-root", "{bad}"],
    "script --verl-root": [
        "script",
        "{script}",
        "--mode",
        "consistency",
        *CONFIGS,
        "--verl-root",
        "{bad}",
        "--dry-run",
    ],
    "check-dump --actor": ["check-dump", "--actor", "{bad}"],
    "check-dump --generate": ["check-dump", "--actor", "{dir}", "--generate", "{bad}"],
    "check-dump --slime-debug": ["check-dump", "--actor", "{dir}", "--slime-debug", "{bad}"],
    # a directory written
    "check-dump --compare-output": [
        "check-dump",
        "--actor",
        "{dir}",
        "--generate",
        "{dir}",
        "--compare",
        "--compare-output",
        "{bad}",
    ],
    "demo --workdir": ["demo", "--offline", "--workdir", "{bad}"],
    "matrix --cache": ["matrix", "--release", "0.0.0", "--cache", "{bad}"],
}

# Which dead ends each option can meet: an input file (missing, a directory), an output file
# (missing folder, a directory, unwritable), an input directory (missing, a file), an output
# directory (a file, unwritable).
KINDS = {
    "in-file": ("missing", "directory"),
    "out-file": ("missing", "directory", "unwritable"),
    "in-dir": ("missing", "file"),
    "out-dir": ("file", "unwritable"),
    "in-any": ("missing",),
}
KIND_OF = {
    "detect SCRIPT": "in-file",
    "script ORIGINAL": "in-file",
    "check-script SCRIPT": "in-file",
    "apply --script": "in-file",
    "verify --script": "in-file",
    "script -o": "out-file",
    "config -o": "out-file",
    "check-dump --compare-output": "out-dir",
    "check-dump --slime-debug": "in-any",
    "demo --workdir": "out-dir",
    "matrix --cache": "out-dir",
}


def dead_ends() -> list[tuple[str, str]]:
    return [(case, end) for case in CASES for end in KINDS[KIND_OF.get(case, "in-dir")]]


@pytest.mark.parametrize(("case", "end"), dead_ends())
def test_a_path_that_cannot_serve_is_refused_with_its_name(case: str, end: str, tmp_path: Path, fixture_tree) -> None:
    scripts = tmp_path / "scripts"
    shutil.copytree(WORKFLOW_SCRIPTS, scripts)
    a_dir = tmp_path / "a-dir"
    a_dir.mkdir()
    a_file = tmp_path / "a-file.txt"
    a_file.write_text("not a folder\n")
    bad = {
        "missing": tmp_path / "dir/that/does/not/exist" / "x.sh",
        "directory": a_dir,
        "file": a_file,
        "unwritable": unwritable_dir(tmp_path) / "x.out",
    }[end]
    fill = {"bad": str(bad), "script": str(scripts / SCRIPT), "dir": str(a_dir), "file": str(a_file)}
    if "{tree}" in CASES[case]:
        fill["tree"] = str(fixture_tree("0.9"))
    args = [part.format(**fill) for part in CASES[case]]
    result = CliRunner().invoke(main, args)
    output = result.stdout + result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit), output
    assert "Traceback" not in output and "internal error" not in output, output
    assert result.exit_code == ExitCode.REFUSED, output
    # the path itself, or for a folder that cannot be written, the folder
    assert str(bad) in output or (end == "unwritable" and str(bad.parent) in output), output
    assert any(words in output.lower() for words in SAYS[end]), output


# What the message says of each dead end (besides the path).
SAYS = {
    "missing": ("does not exist", "no such"),
    "directory": ("is a directory",),
    "file": ("is a file",),
    "unwritable": ("permission denied", "operation not permitted", "read-only"),
}
