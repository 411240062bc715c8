"""Every number of report.json, pinned: the reports, and the writer of the pins (`python tests/report_numbers.py`).

`tests/data/report-numbers.json` holds the report.json that `rlprobe-patch report` wrote for each case below,
recorded before the report was made faster (issue 45): the recorded demo capture and compare
(`tests/data/demo-consistency-vllm`) without a floor, with `--floor-step 1`, and with the clean step as
`--baseline`; and a capture of three steps with longer responses over a wider range of probabilities (written
here from Python's `random`, whose `random()` sequence is fixed across Python versions), for the paths the demo's
48 tokens do not take (position ranges wider than one token, several probability decades, clamped log-ratios).
The paths in a document are written relative to the case's folders (`DEMO`, `CAPTURES`, `OUT`).

A change that is meant to change a number of report.json regenerates the pins in that change
(`python tests/report_numbers.py`), and says why; checked by tests/cli/test_report_numbers.py.
"""

from __future__ import annotations

import json
import math
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from click.testing import CliRunner

from rlprobe_patch.cli import main
from rlprobe_patch.report.capture_format import write_capture

DATA = Path(__file__).resolve().parent / "data" / "report-numbers.json"
DEMO = Path(__file__).resolve().parent / "data" / "demo-consistency-vllm"
STEP1 = "step-000001.rlprobe-logprobs.npz"
STEP2 = "step-000002.rlprobe-logprobs.npz"

# name -> the report's arguments (CAPTURES: the written capture's folder)
CASES: dict[str, list[str]] = {
    "demo": ["DEMO/capture", "DEMO/compare"],
    "demo-floor-step": ["DEMO/capture", "DEMO/compare", "--floor-step", "1", "--top", "3"],
    "demo-baseline": [f"DEMO/capture/{STEP2}", "--baseline", f"DEMO/capture/{STEP1}"],
    "written": ["CAPTURES"],
}


def write_captures(folder: Path) -> None:
    """Three steps of 24 requests, responses of 0 to 700 tokens, probabilities from 1e-9 to 1, a rollout off by
    a few per cent with a drift along the response, a few tokens far apart (|dlogp| above 20) and a few equal."""
    rng = random.Random(45)
    for step in (1, 2, 3):
        rows, width = 24, 700
        lengths = [0 if i == 5 else int(rng.random() * width) + 1 for i in range(rows)]
        mask = np.arange(width)[None, :] < np.array(lengths)[:, None]
        training = np.array([[math.log(rng.random() ** (1 + 8 * rng.random()) + 1e-30) for _ in range(width)]
                             for _ in range(rows)])  # fmt: skip
        noise = np.array([[(rng.random() - 0.5) * 0.1 * step for _ in range(width)] for _ in range(rows)])
        drift = np.arange(width)[None, :] * 1e-4 * step
        rollout = training + noise + drift
        rollout[0, :3] = training[0, :3]  # equal on both sides
        rollout[1, 2] = training[1, 2] - 30.0  # past verl's clamp of the log-ratio
        responses = np.array([[int(rng.random() * 50_000) for _ in range(width)] for _ in range(rows)])
        write_capture(
            folder,
            step=step,
            request_ids=[f"req-{step}-{i}" for i in range(rows)],
            prompt_lengths=np.full(rows, 16),
            responses=responses,
            response_mask=mask,
            rollout_log_probs=np.minimum(rollout, 0.0),
            old_log_probs=training,
            dataset_index=np.arange(rows) + 100 * step,
        )


def _relative(value: Any, places: dict[str, str]) -> Any:
    if isinstance(value, str):
        for path, name in places.items():
            value = value.replace(path, name)
        return value
    if isinstance(value, dict):
        return {k: _relative(v, places) for k, v in value.items()}
    if isinstance(value, list):
        return [_relative(v, places) for v in value]
    return value


def report_json(case: str, work: Path) -> dict[str, Any]:
    """report.json of `case`, as `rlprobe-patch report` writes it into `work`, its paths made relative."""
    captures = work / "captures"
    if "CAPTURES" in CASES[case] and not captures.exists():
        write_captures(captures)
    out = work / f"out-{case}"
    args = [a.replace("DEMO", str(DEMO)).replace("CAPTURES", str(captures)) for a in CASES[case]]
    result = CliRunner().invoke(main, ["report", *args, "-o", str(out)])
    assert result.exit_code in (0, 4), result.output
    document = json.loads((out / "report.json").read_text())
    places = {str(out): "OUT", str(captures): "CAPTURES", str(DEMO): "DEMO"}
    return _relative(document, places)  # type: ignore[no-any-return]


def main_() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        pins = {case: report_json(case, Path(tmp)) for case in CASES}
    DATA.write_text(json.dumps(pins, indent=1, sort_keys=True) + "\n")
    print(f"{DATA}: {len(pins)} reports", file=sys.stderr)


if __name__ == "__main__":
    main_()
