"""check-dump --slime-debug: slime's own debug rollout / train dumps next to msprobe's (issue 18, item 5).

The fast part: the tie between dumped samples and actor steps on stand-in file summaries, and a
missing path. Slime's own writers from the four release archives:
tests/runtime/test_slime_debug_dumps_runtime.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from slime_actor_log import actor_line, write_actor

from rlprobe_patch.cli import main
from rlprobe_patch.workflow.slime_dumps import SlimeDebugReport, tie


def summaries() -> list[dict[str, Any]]:
    """Stand-in file summaries, as the torch reader returns them (no torch needed here)."""
    return [
        {
            "path": "/d/rollout_data/5.pt",
            "kind": "rollout",
            "rollout_id": 5,
            "samples": [
                {"index": 40, "status": "completed", "request_ids": ["slime-40"]},
                {"index": 41, "status": "completed", "request_ids": None},
            ],
        },
        {"path": "/d/train_data/5_1.pt", "kind": "train", "rollout_id": 5, "rank": 1, "sample_indices": [41]},
    ]


def test_tie_matches_samples_with_actor_steps_and_names_what_breaks() -> None:
    lines = [actor_line(0, "update_actor", 41, rollout_id=5), actor_line(1, "update_actor", 40, rollout_id=6)]
    for number, line in enumerate(lines):
        line["_where"] = f"log:{number + 1}"
    report = SlimeDebugReport(files=summaries())
    tie(report, lines)
    (rollout,) = report.rollouts
    assert [s["log"] for s in rollout["actor_steps"]] == ["log:1", "log:2"]
    assert rollout["not_in_actor_steps"] == []
    assert report.problems == ["log:2: logged rollout 6, but its samples [40] belong to rollout 5's dumps"]
    assert any("1 of 2 sample(s) carry no rlprobe_request_ids" in n for n in report.notes)


def test_slime_debug_needs_an_existing_path(tmp_path: Path) -> None:
    actor = write_actor(tmp_path / "actor", [actor_line(0, "log_prob", 1)])
    args = ["check-dump", "--actor", str(actor), "--slime-debug", str(tmp_path / "missing"), "--json"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 3 and "no such file or directory" in json.loads(result.stdout)["message"]
