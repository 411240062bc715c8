"""What `verl.logprob-capture` costs per training step when off (`MISMATCH_ON` unset).

    python bench/capture_offpath.py [--verl-version 0.9.1] [--number 200000] [--repeat 7] [--out r.json]

The capture's counterpart of `bench/gpu/offpath_cost.py` (the engine hooks' statements per
`forward_backward_batch` call). The real verl wheel is unpacked and patched with
`rlprobe-patch apply --only verl.logprob-capture`; from each trainer file the patch edited, the
inserted class `_RlprobeLogprobCapture` is executed from the file, and the hook statements the
trainer runs per training step are taken as the patch wrote them (the lines marked
`# rlprobe-patch: MISMATCH_ON`, by syntax tree): V0 `RayPPOTrainer.fit` runs the capture once
per step (its precondition once per `fit`, reported apart); `SeparateRayPPOTrainer._fit_compute_log_prob`
and the V1 `PPOTrainer._compute_old_log_prob` run once per step and hold two (the precondition and
the capture). `timeit` runs them, with the switches already read (the first step reads them: timed
apart, once per process), minus `pass`; the trainer, batch and data are bare objects the off
path never touches. Off, the hooks import nothing new and make no TransferQueue call; each hook
reads the kept switches (`_rlprobe_run_capture`: an `import sys`, timed apart, and one
`sys.modules` lookup).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tempfile
import timeit
from pathlib import Path

from rlprobe_patch import matrix

MARK = "# rlprobe-patch: MISMATCH_ON"
SWITCHES = ("MISMATCH_ON", "MISMATCH_DIR", "PROMPTS_ONLY")


def patched_tree(version: str, dest: Path) -> tuple[Path, list[str]]:
    """The release unpacked at `dest`, patched by `apply --only verl.logprob-capture`, and the files it edited."""
    root = matrix.unpack_release(matrix.fetch_release("verl", version), dest / f"verl-{version}", "verl")
    env = {**os.environ, "RLPROBE_PATCH_STATE_HOME": str(dest / "state")}
    cmd = [sys.executable, "-m", "rlprobe_patch", "apply", "--verl-root", str(root), "--backend", "fsdp"]
    proc = subprocess.run([*cmd, "--only", "verl.logprob-capture", "--json"], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"apply failed:\n{proc.stdout}{proc.stderr}")
    return root, sorted(json.loads(proc.stdout)["files"])


def hooks(path: Path) -> tuple[type, dict[str, list[str]]]:
    """The inserted class, and {`Class.method`: the hook statements in it, in order} of one patched file."""
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source, filename=str(path))
    lines = source.splitlines()
    capture = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "_RlprobeLogprobCapture")
    namespace: dict = {}
    exec(compile(ast.Module(body=[capture], type_ignores=[]), str(path), "exec"), namespace)
    found: dict[str, list[str]] = {}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n is not capture):
        for method in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
            for node in ast.walk(method):
                if isinstance(node, ast.Expr) and MARK in lines[node.lineno - 1]:
                    found.setdefault(f"{cls.name}.{method.name}", []).append(ast.unparse(node))
    return namespace["_RlprobeLogprobCapture"], found


def best_ns(stmt: str, env: dict, number: int, repeat: int) -> float:
    return min(timeit.repeat(stmt, globals=env, number=number, repeat=repeat)) / number * 1e9


def _import_sys() -> None:
    import sys  # noqa: F401  (what `_rlprobe_run_capture` does first, on every call)


def import_sys_ns(number: int, repeat: int) -> float:
    """An `import sys` inside a function, the largest part of the off path on CPython 3.11."""
    env = {"f": _import_sys, "g": lambda: None}
    return best_ns("f()", env, number, repeat) - best_ns("g()", env, number, repeat)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--verl-version", default="0.9.1")
    p.add_argument("--number", type=int, default=200_000)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    for switch in SWITCHES:
        os.environ.pop(switch, None)

    result: dict = {"verl": args.verl_version, "python": sys.version.split()[0], "ns_per_training_step": {}}
    with tempfile.TemporaryDirectory(prefix="capture-offpath-") as tmp:
        root, files = patched_tree(args.verl_version, Path(tmp))
        for rel in files:
            capture, found = hooks(root / rel)
            bare = object()
            env = {"_RlprobeLogprobCapture": capture, "self": bare, "batch": bare, "data": bare}
            for where, statements in found.items():
                # `fit` holds the V0 loop: its first statement (the precondition) runs once per fit.
                per_run = statements[:1] if where.endswith(".fit") else []
                per_step = statements[len(per_run) :]
                sys.modules.pop("_rlprobe_patch_capture", None)
                first = best_ns("\n".join(per_step), env, 1, 1)  # reads the switches, keeps them
                step = best_ns("\n".join(per_step), env, args.number, args.repeat)
                empty = best_ns("pass", env, args.number, args.repeat)
                cost = {
                    "file": rel,
                    "statements_per_step": per_step,
                    "ns_per_step": round(step - empty, 1),
                    "first_step_ns": round(first, 1),
                }
                if per_run:
                    run = best_ns(per_run[0], env, args.number, args.repeat)
                    cost["per_run"] = per_run
                    cost["ns_per_run"] = round(run - empty, 1)
                result["ns_per_training_step"][where] = cost
                print(
                    f"{where}: {len(per_step)} statement(s) per training step, {cost['ns_per_step']} ns "
                    f"(the first step, reading the switches: {cost['first_step_ns'] / 1000:.1f} us)"
                    + (f"; once per fit: {cost['ns_per_run']} ns" if per_run else "")
                )
        result["import_sys_in_a_function_ns"] = imported = round(import_sys_ns(args.number, args.repeat), 1)
        print(f"of which each hook's `import sys` (in _rlprobe_run_capture): {imported} ns")
        written = sorted(Path(tmp).rglob("*.rlprobe-logprobs.npz")) + sorted(Path.cwd().glob("rlprobe-logprobs"))
        if written:
            raise SystemExit(f"the capture wrote with MISMATCH_ON unset: {written}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
