"""`rlprobe-patch report`: per-token train-vs-rollout log-probs joined with the layer compare.

Above `workflow` (it reads slime's dumps through `workflow.slime_dumps`' finder and
`workflow.envprobe`), below `matrix`, `demo` and `cli`:

- `capture_format.py`: the per-step capture file (`write_capture`, `read_capture`, `TokenBatch`);
- `slime_logprobs.py`: slime's debug dumps joined by rollout position, else sample index;
- `layers.py`: msprobe's compare CSVs, module by module in forward order;
- `metrics.py`: verl's debug and off-policy metrics re-implemented in numpy, per-request figures,
  the difference by position and by probability;
- `build.py`: the inputs sorted and read, the report's document, the thresholds, the replay files;
- `render.py`: report.html (matplotlib plots embedded) and the text summary;
- `write_outputs` (here): report.json and report.html, each whole or not at all.

numpy and matplotlib are the `report` extra; they are imported when the command runs.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rlprobe_patch.fsio import atomic_write


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else str(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if not k.startswith("_")}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def to_json(report: dict[str, Any]) -> dict[str, Any]:
    """The report as JSON holds it: NaN as null, private arrays dropped."""
    plain: dict[str, Any] = _plain(report)
    return plain


def write_outputs(report: dict[str, Any], html_text: str, directory: Path) -> dict[str, str]:
    """report.json then report.html, each through a temporary file and a rename."""
    directory.mkdir(parents=True, exist_ok=True)
    json_path, html_path = directory / "report.json", directory / "report.html"
    atomic_write(json_path, (json.dumps(to_json(report), indent=1) + "\n").encode())
    atomic_write(html_path, html_text.encode())
    return {"json": str(json_path), "html": str(html_path)}
