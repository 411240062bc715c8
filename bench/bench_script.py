"""Benchmark: the launch-script reader on verl's own examples, as ratios measured in one run.

    python bench/bench_script.py [--runs 7] [--script grpo_trainer/run_qwen3_8b_megatron.sh]

Prints medians of:
- `rlprobe-patch detect SCRIPT --verl-root ROOT --json`, a whole process (start-up, bash reading,
  Hydra compose, facts), on a v0.8.0 example with the real verl 0.8.0 tree;
- a bare `hydra.compose` of the same overrides with the same config, in a fresh process (the floor
  for anything that asks Hydra): target `detect` <= 1.5x of it;
- the reader alone (tree-sitter parse + static evaluation) on the largest example script of both
  corpora, in process: target < 20 ms.
The examples are read from `../shared/upstream/verl-examples` beside the repository.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from rlprobe_patch.catalogue.wheels import fetch_wheel
from rlprobe_patch.launch.script import ReaderOptions, read_script
from rlprobe_patch.launch.shell import read_shell

EXAMPLES = Path(__file__).resolve().parents[2] / "shared" / "upstream" / "verl-examples"

BARE = """
import sys
from hydra import compose, initialize_config_dir
with initialize_config_dir(config_dir=sys.argv[1], version_base=None):
    config = compose(config_name=sys.argv[2], overrides=sys.argv[3:])
print(config.actor_rollout_ref.actor.strategy)
"""


def timed(command: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run(command, cwd=cwd, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--script", default="grpo_trainer/run_qwen3_8b_megatron.sh", help="under v0.8.0/examples")
    opts = parser.parse_args()
    if not EXAMPLES.is_dir():
        sys.exit(f"no {EXAMPLES}: the benchmark reads verl's examples from ../shared/upstream")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        root = work / "tree"
        with zipfile.ZipFile(fetch_wheel("verl", "0.8.0")) as zf:
            zf.extractall(root, [m for m in zf.namelist() if m.startswith("verl/")])
        repo = work / "repo"  # the examples are run from a verl checkout's root
        repo.mkdir()
        (repo / "examples").symlink_to(EXAMPLES / "v0.8.0" / "examples")
        (repo / "verl").symlink_to(root / "verl")
        script = f"examples/{opts.script}"

        reading = read_script(repo / script, ReaderOptions(verl_root=root, release="0.8.0"))
        assert reading.launch is not None and reading.composed is not None and not reading.composed.errors
        overrides = [f.text for f in reading.launch.args if not f.text.startswith("-")]
        config_dir = str(root / "verl" / "trainer" / "config")
        bare = [sys.executable, "-c", BARE, config_dir, reading.composed.config_file.removesuffix(".yaml"), *overrides]
        detect = [sys.executable, "-m", "rlprobe_patch", "detect", script, "--verl-root", str(root), "--json"]
        timed(bare, repo), timed(detect, repo)  # warm the file cache and bytecode
        bare_times, detect_times = [], []
        for _ in range(opts.runs):  # interleaved: the machine drifts
            bare_times.append(timed(bare, repo))
            detect_times.append(timed(detect, repo))
        ratios = [d / b for d, b in zip(detect_times, bare_times)]

        largest = max(EXAMPLES.rglob("*.sh"), key=lambda p: p.stat().st_size)
        read_shell(largest, cwd=largest.parent)
        parse_times = []
        for _ in range(opts.runs * 5):
            start = time.perf_counter()
            read_shell(largest, cwd=largest.parent)
            parse_times.append(time.perf_counter() - start)

    print(f"script: v0.8.0/examples/{opts.script} ({len(overrides)} overrides), verl 0.8.0, {opts.runs} runs")
    print(f"bare hydra.compose, fresh process   {statistics.median(bare_times):.3f} s")
    print(f"detect --verl-root --json, process  {statistics.median(detect_times):.3f} s")
    print(f"ratio (median of paired runs)       {statistics.median(ratios):.2f}x   (target <= 1.5x)")
    size = largest.stat().st_size
    parse_ms = statistics.median(parse_times) * 1000
    print(f"reader alone, largest example ({largest.name}, {size} bytes)  {parse_ms:.1f} ms   (target < 20 ms)")


if __name__ == "__main__":
    main()
