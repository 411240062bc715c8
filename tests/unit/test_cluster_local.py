"""The cluster command's parts that need no Ray: local commands never import it; node agreement."""

from __future__ import annotations

import subprocess
import sys

from conftest import FIXTURES

from rlprobe_patch.cluster.operations import disagreements


def test_local_commands_never_import_ray(tmp_path) -> None:
    code = (
        "import sys\nfrom rlprobe_patch.cli import main\n"
        f"try:\n    main(['status', '--verl-root', {str(FIXTURES / 'verl-0.9')!r}, '--json'])\n"
        "except SystemExit as exc:\n    assert exc.code == 0, exc.code\n"
        "sys.stderr.write('RAY' if 'ray' in sys.modules else 'NO-RAY')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stderr.endswith("NO-RAY"), done.stderr


def node(version: str, target: str = "t1", tool: str = "0.1.0") -> dict:
    return {"tool_version": tool, "trees": [{"package": "verl", "version": version, "target": target}]}


def test_the_odd_node_is_named_with_the_others_value() -> None:
    reasons = disagreements({"a": node("0.9.1"), "b": node("0.9.1"), "c": node("0.8.0")})
    assert reasons["a"] == reasons["b"] == []
    assert reasons["c"] == ["verl 0.8.0 here; elsewhere: verl 0.9.1"]


def test_a_tie_names_every_node_and_a_different_diff_is_named() -> None:
    tie = disagreements({"a": node("0.9.1"), "b": node("0.8.0")})
    assert tie["a"] and tie["b"]
    drift = disagreements({"a": node("0.9.1"), "b": node("0.9.1"), "c": node("0.9.1", target="t2")})
    assert not drift["a"] and not drift["b"] and "would differ" in drift["c"][0]
    tools = disagreements({"a": node("0.9.1"), "b": node("0.9.1"), "c": node("0.9.1", tool="0.0.9")})
    assert tools["c"] == ["rlprobe-patch 0.0.9 here, 0.1.0 elsewhere"]
    missing = disagreements({"a": node("0.9.1"), "b": node("0.9.1"), "c": {"tool_version": "0.1.0", "trees": []}})
    assert missing["c"] == ["no verl tree here; elsewhere: verl 0.9.1"]
