"""`rlprobe-patch report` against only loading its captures, at 1M and at 10M response tokens, in one run.

    python bench/bench_report.py [--tokens 1000000 10000000] [--width 1024] [--batch 256] [--repeat 3]

Writes the captures once with `write_capture` (the format's one writer) into a temporary folder: steps of
`--batch` samples of 1 to `--width` response tokens (random log-probs, the rollout's off by a little noise)
until the largest size is reached; each smaller size is the first steps of the same run (linked, not
written again). For each size it then times (a) `read_capture` on every file, (b) the report's floor: what
the command cannot do without, its imports (the CLI, the report's modules) and its reading of the captures as
it reads them (two at a time), nothing computed, and (c) the whole report (`rlprobe-patch report --json`: read,
metrics, the diagnosis, the plots, report.html and report.json) in a fresh process each, with its CPU time
(user and system: the report's threads can take more of it than its wall time) and its peak resident memory
(ru_maxrss). The three are run in turn `--repeat` times; the
fastest of each is kept (a machine shared with other jobs slows single runs by tens of per cent), and the
load average is printed before and after. The package's bytecode is compiled first, as an installed
package's is (`PYTHONDONTWRITEBYTECODE=1` would otherwise make every report process compile rlprobe_patch's
modules from source, a cost the load, with four modules, hardly pays).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
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
elif sys.argv[1] == "floor":  # what the report cannot do without: its imports, and its reading as it reads
    from rlprobe_patch.cli import main
    from rlprobe_patch.report import make
    batches, _, _ = make.read_inputs(make.classify([Path(sys.argv[2])]), None)
    tokens = int(sum(b.mask.sum() for b in batches))
else:  # the command as `rlprobe-patch report` runs it (click's own main, no test runner)
    import contextlib, io
    from rlprobe_patch.cli import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):  # the command exits with its code
        main(["report", sys.argv[2], "-o", sys.argv[3], "--json"])
    tokens = json.loads(out.getvalue())["tokens"]["tokens"]
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"seconds": time.perf_counter() - t, "tokens": tokens, "cpu_seconds": usage.ru_utime + usage.ru_stime,
                  "peak_mib": usage.ru_maxrss / 1024}))
"""


def write_run(folder: Path, tokens: int, width: int, batch: int) -> list[tuple[Path, int]]:
    """Steps written until `tokens` response tokens: each file, and the tokens up to and including it."""
    rng = np.random.default_rng(0)
    written, step, files = 0, 0, []
    while written < tokens:
        lengths = rng.integers(1, width + 1, batch)
        mask = np.arange(width)[None, :] < lengths[:, None]
        training = np.log(rng.uniform(0.01, 1.0, mask.shape))
        path = write_capture(folder, step=step, request_ids=[f"s{step}-{i}" for i in range(batch)],
                             prompt_lengths=np.full(batch, 64), responses=rng.integers(0, 150_000, mask.shape),
                             response_mask=mask, rollout_log_probs=training + rng.normal(0, 0.01, mask.shape),
                             old_log_probs=training)  # fmt: skip
        written += int(mask.sum())
        files.append((Path(path), written))
        step += 1
    return files


def measure(folder: Path, out: Path, repeat: int) -> dict[str, Any]:
    """The fastest of `repeat` loads and reports of `folder`, run in turn, and the ratio."""
    runs: dict[str, Any] = {}
    for _ in range(repeat):
        for what in ("load", "floor", "report"):
            proc = subprocess.run([sys.executable, "-c", _RUN, what, str(folder), str(out)],
                                  capture_output=True, text=True, check=True)  # fmt: skip
            run = json.loads(proc.stdout.strip().splitlines()[-1])
            runs.setdefault(what + "_all", []).append(round(run["seconds"], 3))
            if what not in runs or run["seconds"] < runs[what]["seconds"]:
                runs[what] = run
    runs["ratio"] = runs["report"]["seconds"] / runs["load"]["seconds"]
    runs["floor_ratio"] = runs["floor"]["seconds"] / runs["load"]["seconds"]
    return runs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    compileall.compile_dir(str(Path(rlprobe_patch.__file__).parent), quiet=1)
    with tempfile.TemporaryDirectory() as tmp:
        files = write_run(Path(tmp) / "run", max(args.tokens), args.width, args.batch)
        result: dict[str, Any] = {"load_average_before": os.getloadavg()}
        for size in sorted(args.tokens):
            folder = Path(tmp) / f"cap-{size}"
            folder.mkdir()
            for path, _ in files[: next(i for i, (_, n) in enumerate(files) if n >= size) + 1]:
                os.link(path, folder / path.name)
            runs = measure(folder, Path(tmp) / f"out-{size}", args.repeat)
            runs["files"] = len(list(folder.iterdir()))
            result[str(size)] = runs
            load, floor, report = runs["load"], runs["floor"], runs["report"]
            print(f"{report['tokens']} tokens ({runs['files']} steps): load {load['seconds']:.3f} s, report "
                  f"{report['seconds']:.3f} s, ratio {runs['ratio']:.2f}x (CPU time of the fastest: "
                  f"{load['cpu_seconds']:.2f} s, {report['cpu_seconds']:.2f} s); the report's floor (its imports "
                  f"and its reading, nothing else) {floor['seconds']:.3f} s, {runs['floor_ratio']:.2f}x",
                  file=sys.stderr)  # fmt: skip
        result["load_average_after"] = os.getloadavg()
        print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
