"""Stand-in actor logs for check-dump --slime-debug, in the format of the slime.megatron-actor
hook's `_log_step` (tests/cli/test_slime_debug_dumps.py, tests/runtime/test_slime_debug_dumps_runtime.py).
"""

from __future__ import annotations

import json
from pathlib import Path


def actor_line(step: int, phase: str, index: int, request_id: str | None = None, rollout_id: int | None = 3) -> dict:
    """One line as slime.megatron-actor's `_log_step` writes it (stand-in)."""
    return {
        "source": "update_actor",
        "framework": "slime",
        "phase": phase,
        "role": "actor",
        "rank": 0,
        "dp_rank": 0,
        "tp_rank": 0,
        "pp_rank": 0,
        "cp_rank": 0,
        "rollout_id": rollout_id if phase == "update_actor" else None,
        "train_step": 0 if phase == "update_actor" else None,
        "step": step,
        "sample_indices": [index],
        "rollout_positions": [],
        "request_ids": [request_id or f"slime-{index}"],
        "num_requests": 1,
    }


def write_actor(root: Path, lines: list[dict]) -> Path:
    (root / "4321").mkdir(parents=True)
    for line in lines:
        (root / f"step{line['step']}" / "rank0").mkdir(parents=True, exist_ok=True)
        (root / f"step{line['step']}" / "rank0" / "dump.json").write_text("{}")
    (root / "4321" / "update_actor_log.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return root
