"""`rlprobe-patch report` over one million response tokens against only loading the captures.

    python bench/bench_report.py [--tokens 1000000] [--width 1024] [--repeat 3]

Writes the captures with `write_capture` (the format's one writer) into a temporary folder, then
times (a) `read_capture` on every file and (b) the whole report (read, metrics, plots, report.html
and report.json) in a fresh process each, with its peak resident memory (ru_maxrss). The two are
run in turn `--repeat` times; the fastest of each is kept (a machine shared with other jobs slows
single runs by tens of per cent). The package's bytecode is compiled first, as an installed
package's is (`PYTHONDONTWRITEBYTECODE=1` would otherwise make every report process compile
rlprobe_patch's modules from source, a cost the load, with four modules, hardly pays).
"""

from __future__ import annotations

import argparse
import compileall
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

import rlprobe_patch
from rlprobe_patch.report.capture_format import write_capture

_RUN = r"""
import json, resource, sys, time
from pathlib import Path
t = time.perf_counter()
if sys.argv[1] == "load":
    from rlprobe_patch.report.capture_format import read_capture
    batches = [read_capture(p) for p in sorted(Path(sys.argv[2]).glob("*.npz"))]
    tokens = int(sum(b.mask.sum() for b in batches))
else:  # the command as `rlprobe-patch report` runs it (click's own main, no test runner)
    import contextlib, io
    from rlprobe_patch.cli import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):  # the command exits with its code
        main(["report", sys.argv[2], "-o", sys.argv[3], "--json"])
    tokens = json.loads(out.getvalue())["tokens"]["tokens"]
print(json.dumps({"seconds": time.perf_counter() - t, "tokens": tokens,
                  "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=1_000_000)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    compileall.compile_dir(str(Path(rlprobe_patch.__file__).parent), quiet=1)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "cap"
        written, step = 0, 0
        while written < args.tokens:
            lengths = rng.integers(1, args.width + 1, args.batch)
            mask = np.arange(args.width)[None, :] < lengths[:, None]
            training = np.log(rng.uniform(0.01, 1.0, mask.shape))
            write_capture(folder, step=step, request_ids=[f"s{step}-{i}" for i in range(args.batch)],
                          prompt_lengths=np.full(args.batch, 64), responses=rng.integers(0, 150_000, mask.shape),
                          response_mask=mask, rollout_log_probs=training + rng.normal(0, 0.01, mask.shape),
                          old_log_probs=training)  # fmt: skip
            written += int(mask.sum())
            step += 1
        runs: dict[str, Any] = {}
        for _ in range(args.repeat):
            for what in ("load", "report"):
                proc = subprocess.run([sys.executable, "-c", _RUN, what, str(folder), str(Path(tmp) / "out")],
                                      capture_output=True, text=True, check=True)  # fmt: skip
                run = json.loads(proc.stdout.strip().splitlines()[-1])
                if what not in runs or run["seconds"] < runs[what]["seconds"]:
                    runs[what] = run
        runs["ratio"] = runs["report"]["seconds"] / runs["load"]["seconds"]
        runs["files"] = step
        print(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
