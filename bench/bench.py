"""Benchmark: rlprobe-patch on the real verl 0.9.1 tree, as ratios measured in one run.

    python bench/bench.py [--runs 5] [--verl-version 0.9.1] [--set consistency|engines] [--packages 1000]

Prints medians of: whole processes, side by side (what a user waits for: start-up and imports
count): `rlprobe-patch apply` run as a command against `python` parsing and generating the same
files with LibCST (the floor for a LibCST tool that parses whole files; apply parses only the
classes and functions its codemods read, `codemod/_partial_parse.py`), each pair on the same fresh copy; then, in this
process: a bare LibCST parse + code generation of the files the set patches, apply (`--set
consistency`, the default: `apply --mode consistency --backend fsdp`, eight files on 0.9.1;
`--set engines`: the FSDP and Megatron engine hooks),
verify (files apply wrote are known to its syntax-tree check: not parsed again), verify
--recheck (every file parsed and checked again), revert,
`rlprobe-patch --version`, `python -c pass`, and the discovery of the trees
(`apply --python P --mode consistency`: verl, SGLang, vLLM-Ascend asked with find_spec) in an
interpreter whose path is a site-packages folder with many packages (this interpreter's own,
plus `--packages` small ones) against one whose path holds only the verl tree; then the
ratios. Each timed apply starts from a fresh copy of the tree (the copy is not timed).
"""

from __future__ import annotations

import argparse
import gc
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

from rlprobe_patch.catalogue.trees import find_verl_tree
from rlprobe_patch.core.apply import apply
from rlprobe_patch.core.plan import Selection, plan_apply
from rlprobe_patch.core.revert import revert
from rlprobe_patch.core.roots import Roots
from rlprobe_patch.core.verify import verify
from rlprobe_patch.demo.patch_cycle import fetch_verl_wheel

SETS = {
    "consistency": [Selection("fsdp", "consistency", worker_impl="engine")],
    "engines": [Selection("fsdp"), Selection("megatron")],
}
# The same sets as commands: one `rlprobe-patch apply` per selection.
COMMANDS = {
    "consistency": [["--backend", "fsdp", "--mode", "consistency", "--worker-impl", "engine"]],
    "engines": [["--backend", "fsdp"], ["--backend", "megatron"]],
}
# The whole-process floor: a fresh interpreter that imports LibCST, parses each file and generates its code.
FLOOR = """
import sys
from pathlib import Path
import libcst
root = Path(sys.argv[1])
for rel in sys.argv[2:]:
    libcst.parse_module((root / rel).read_bytes()).code
"""


def interpreter(work: Path, name: str, path: Path) -> str:
    """A `--python` whose import path is `path` only (no site-packages of its own)."""
    script = work / f"python-{name}"
    script.write_text(f'#!/bin/sh\nPYTHONPATH={path} exec {sys.executable} -S "$@"\n')
    script.chmod(0o755)
    return str(script)


def many_packages(work: Path, pristine: Path, extra: int) -> Path:
    """A site-packages folder: links to every entry of this interpreter's, `extra` small packages, verl."""
    import site

    folder = work / "site-packages"
    folder.mkdir()
    for real in site.getsitepackages():
        for entry in Path(real).iterdir():
            if not (folder / entry.name).exists() and entry.name not in ("verl", "sglang", "vllm_ascend"):
                (folder / entry.name).symlink_to(entry)
    for i in range(extra):
        (folder / f"pkg_{i:04d}").mkdir()
        (folder / f"pkg_{i:04d}" / "__init__.py").write_text("")
        (folder / f"pkg_{i:04d}-1.0.dist-info").mkdir()
    (folder / "verl").symlink_to(pristine / "verl")
    return folder


def median_time(fn: Callable[[], object], runs: int, setup: Callable[[], None] = lambda: None) -> float:
    times = []
    for _ in range(runs):
        setup()
        gc.collect()  # garbage of the previous run is not charged to this one
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--verl-version", default="0.9.1")
    parser.add_argument("--set", choices=sorted(SETS), default="consistency")
    parser.add_argument("--packages", type=int, default=1000, help="small packages added to the site-packages")
    args = parser.parse_args()
    selections = SETS[args.set]

    work = Path(tempfile.mkdtemp(prefix="rlprobe-bench-"))
    os.environ["RLPROBE_PATCH_STATE_HOME"] = str(work / "state")
    pristine = work / "pristine"
    with zipfile.ZipFile(fetch_verl_wheel(args.verl_version, lambda m: print(m, file=sys.stderr))) as zf:
        zf.extractall(pristine)
    root = work / "tree"

    def fresh() -> None:
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(pristine, root)

    fresh()
    targets = sorted({rel for sel in selections for rel in plan_apply(find_verl_tree(root), sel, {}).changes})

    # Whole processes, as installed: bytecode cached (a PYTHONDONTWRITEBYTECODE=1 shell would
    # recompile our modules at every start; the first, untimed runs write the caches).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    floor_cmd = [sys.executable, "-c", FLOOR, str(root), *targets]
    apply_cmds = [
        [sys.executable, "-m", "rlprobe_patch", "apply", "--verl-root", str(root), *cmd, "--json"]
        for cmd in COMMANDS[args.set]
    ]

    def floor_process() -> None:
        subprocess.run(floor_cmd, check=True, env=env)

    def apply_process() -> None:
        for cmd in apply_cmds:
            subprocess.run(cmd, check=True, capture_output=True, env=env)

    floor_process()
    apply_process()
    p_floors, p_applies = [], []
    for _ in range(args.runs):  # interleaved, each pair on the same fresh copy
        fresh()
        p_floors.append(median_time(floor_process, 1))
        p_applies.append(median_time(apply_process, 1))
    tp_floor, tp_apply = statistics.median(p_floors), statistics.median(p_applies)
    rp_apply = statistics.median(a / f for a, f in zip(p_applies, p_floors, strict=True))
    fresh()

    def floor() -> None:
        for rel in targets:
            cst.parse_module((root / rel).read_bytes()).code  # noqa: B018 - the codegen is the work

    def do_apply() -> None:
        tree = find_verl_tree(root)
        for selection in selections:
            apply(tree, selection)

    # Interleaved, each pair on the same fresh copy, so that both see the same machine state.
    floors, applies = [], []
    do_apply()  # the first apply of a process loads the catalogue's codemods and payloads: not timed
    for _ in range(args.runs):
        fresh()
        floors.append(median_time(floor, 1))
        applies.append(median_time(do_apply, 1))
    t_floor, t_apply = statistics.median(floors), statistics.median(applies)
    # The machine drifts between runs: the ratio is the median of each run's own ratio.
    r_apply = statistics.median(a / f for a, f in zip(applies, floors, strict=True))
    fresh()
    do_apply()
    t_verify = median_time(lambda: verify(find_verl_tree(root)), args.runs)
    t_recheck = median_time(lambda: verify(find_verl_tree(root), recheck=True), args.runs)

    def patched() -> None:
        fresh()
        do_apply()

    t_revert = median_time(lambda: revert(root), args.runs, setup=patched)
    cli = [sys.executable, "-m", "rlprobe_patch", "--version"]
    subprocess.run(cli, check=True, capture_output=True, env=env)
    t_cli = median_time(lambda: subprocess.run(cli, check=True, capture_output=True, env=env), 4 * args.runs)
    t_py = median_time(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True, env=env), 4 * args.runs)
    crowded = interpreter(work, "many", many_packages(work, pristine, args.packages))
    bare = interpreter(work, "bare", pristine)
    entries = len(list((work / "site-packages").iterdir()))
    t_many = median_time(lambda: Roots({}, crowded).for_apply("consistency", True), args.runs)
    t_bare = median_time(lambda: Roots({}, bare).for_apply("consistency", True), args.runs)

    print(f"verl {args.verl_version}, set {args.set} ({len(targets)} files), {args.runs} runs each, medians (s):")
    rows = [
        (f"process: python, LibCST parse + codegen of the {len(targets)} files", tp_floor),
        (f"process: rlprobe-patch apply ({args.set})", tp_apply),
        (f"LibCST parse + codegen of the {len(targets)} files", t_floor),
        (f"apply ({args.set})", t_apply),
        ("verify", t_verify),
        ("verify --recheck (every file parsed again)", t_recheck),
        ("revert", t_revert),
        ("rlprobe-patch --version", t_cli),
        ("python -c pass", t_py),
        (f"discovery, site-packages of {entries} entries", t_many),
        ("discovery, bare verl tree", t_bare),
    ]
    for name, value in rows:
        print(f"  {name:<58} {value:8.3f}")
    print("ratios:")
    print(f"  process: apply / LibCST floor  {rp_apply:6.2f}x  (median of the {args.runs} paired runs)")
    print(f"  in-process: apply / floor      {r_apply:6.2f}x  (median of the {args.runs} paired runs)")
    print(f"  verify / floor            {t_verify / t_floor:6.2f}x")
    print(f"  verify --recheck / floor  {t_recheck / t_floor:6.2f}x")
    print(f"  revert / floor            {t_revert / t_floor:6.2f}x")
    print(f"  verify / apply            {t_verify / t_apply:6.2f}x")
    print(f"  verify --recheck / apply  {t_recheck / t_apply:6.2f}x")
    print(f"  revert / apply            {t_revert / t_apply:6.2f}x")
    print(f"  CLI start-up / python     {t_cli / t_py:6.1f}x")
    print(f"  discovery many / bare     {t_many / t_bare:6.2f}x")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
