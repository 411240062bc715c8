"""Benchmark: rlprobe-patch on the real verl 0.9.1 tree, as ratios measured in one run.

    python bench/bench.py [--runs 5] [--verl-version 0.9.1]

Prints medians of: a bare LibCST parse + code generation of the patched files (the floor for
any LibCST tool), apply (both engine patches), verify, revert, `rlprobe-patch --version`,
and `python -c pass`; then the ratios apply/floor, verify/apply, revert/apply and CLI
start-up/python start-up. Each timed apply starts from a fresh copy of the tree (the copy
is not timed).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import libcst as cst

from rlprobe_patch.demo import fetch_verl_wheel
from rlprobe_patch.engine import apply, revert, verify
from rlprobe_patch.trees import find_verl_tree

TARGETS = ("verl/workers/engine/fsdp/transformer_impl.py", "verl/workers/engine/megatron/transformer_impl.py")


def median_time(fn: Callable[[], object], runs: int, setup: Callable[[], None] = lambda: None) -> float:
    times = []
    for _ in range(runs):
        setup()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--verl-version", default="0.9.1")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="rlprobe-bench-"))
    os.environ["RLPROBE_PATCH_STATE_HOME"] = str(work / "state")
    pristine = work / "pristine"
    with zipfile.ZipFile(fetch_verl_wheel(args.verl_version, lambda m: print(m, file=sys.stderr))) as zf:
        zf.extractall(pristine)
    root = work / "tree"

    def fresh() -> None:
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(pristine, root)

    def floor() -> None:
        for rel in TARGETS:
            cst.parse_module((root / rel).read_bytes()).code  # noqa: B018 - the codegen is the work

    def do_apply() -> None:
        tree = find_verl_tree(root)
        apply(tree, "fsdp")
        apply(tree, "megatron")

    fresh()
    t_floor = median_time(floor, args.runs)
    t_apply = median_time(do_apply, args.runs, setup=fresh)
    fresh()
    do_apply()
    t_verify = median_time(lambda: verify(find_verl_tree(root)), args.runs)

    def patched() -> None:
        fresh()
        do_apply()

    t_revert = median_time(lambda: revert(root), args.runs, setup=patched)
    cli = [sys.executable, "-m", "rlprobe_patch", "--version"]
    t_cli = median_time(lambda: subprocess.run(cli, check=True, capture_output=True), args.runs)
    t_py = median_time(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True), args.runs)

    print(f"verl {args.verl_version}, {args.runs} runs each, medians (s):")
    rows = [
        ("LibCST parse + codegen of the 2 files", t_floor),
        ("apply (fsdp + megatron)", t_apply),
        ("verify", t_verify),
        ("revert", t_revert),
        ("rlprobe-patch --version", t_cli),
        ("python -c pass", t_py),
    ]
    for name, value in rows:
        print(f"  {name:<40} {value:8.3f}")
    print("ratios:")
    print(f"  apply / LibCST floor      {t_apply / t_floor:6.1f}x")
    print(f"  verify / apply            {t_verify / t_apply:6.2f}x")
    print(f"  revert / apply            {t_revert / t_apply:6.2f}x")
    print(f"  CLI start-up / python     {t_cli / t_py:6.1f}x")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
