"""slime's debug dumps (`--save-debug-rollout-data`, `--save-debug-train-data`), read by torch in the training
interpreter: one load per file, two readings (`base/probes/slime_dumps.py`): `check`, what check-dump ties, and
`logprobs`, what the report joins."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from rlprobe_patch.base.errors import RefusedError
from rlprobe_patch.base.interpreter import last_line, run_probe, stderr_tail

# an evaluation rollout's dump (`eval_<n>` in its name): no training side
EVAL_ROLLOUT = re.compile(r"(^|[^A-Za-z])eval_\d+")


def is_evaluation(path: str | Path) -> bool:
    return bool(EVAL_ROLLOUT.search(Path(path).name))


def read_slime_dumps(files: list[Path], python: str | None, timeout: float) -> list[dict[str, Any]]:
    """Each file's two readings ({"check": ..., "logprobs": ...}), by torch (`weights_only`) in `python`;
    refused, naming the files and torch's last word, where that interpreter cannot read them."""
    proc = run_probe(python, "slime_dumps", timeout=timeout, stdin=json.dumps([str(f) for f in files]))
    items = last_line(proc, "[")
    if isinstance(items, list):
        return items
    more = f" and {len(files) - 1} more" if len(files) > 1 else ""
    raise RefusedError(
        f"cannot read slime's debug dumps ({files[0]}{more}): {stderr_tail(proc)}",
        hint="they are torch files: pass --python with the training environment's interpreter (it has torch)",
    )
