"""Several runs of a driver in one interpreter: its heavy imports once, each run in a process of its own.

A driver started once per run pays for importing torch and transformers every time (about 4 s of CPU on 2 cores,
more than many of its runs take). With ``--runs SPEC`` a driver (tests/runtime/fsdp_driver.py, legacy_driver.py)
imports them once and then forks one child per run, one after the other: each child sets the run's environment
(the whole of it, as ``subprocess.run(env=...)`` would), sends its standard error to the run's file, calls the
driver's ``main(argv)`` and exits with its code. A child is a process of its own, as a separate start is: the
switches a hook reads once per process, msprobe's debugger and ``torch.distributed``'s group are each child's own,
and nothing a child does reaches the next. What the children share is what the parent imported before forking:
modules only, no torch operation run (so no thread pool started), nothing of verl or msprobe (a patched tree is
imported by the run that uses it, and a test that asserts msprobe was not imported still sees that).

SPEC is a JSON list of ``{"argv": [...], "env": {...}, "stderr": PATH}``; the codes are printed as one JSON list on
standard output. A run still going after ``RUN_TIMEOUT_S`` is ended by its own alarm (SIGALRM: exit code -14), as a
separate start's ``subprocess.run(timeout=...)`` ended it; a hang fails its test, and never outlives the driver by
long. Standard library only: this runs in the test venvs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

RUN_TIMEOUT_S = 600  # one run of a driver, imports included: a hang


def run_forked(spec: Path, preload: Callable[[], None], main: Callable[[list[str]], int]) -> int:
    """`preload()`, then `main(run["argv"])` in a forked child per run of `spec`, in turn; 0 when every run
    exited 0. A child's own failure (an exception `main` let through) is its traceback on its standard error
    and exit code 1."""
    runs = json.loads(spec.read_text())
    preload()
    sys.stdout.flush()
    sys.stderr.flush()
    codes = []
    for run in runs:
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 1
            try:
                signal.alarm(RUN_TIMEOUT_S)
                err = os.open(run["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(err, 2)
                os.close(err)
                os.environ.clear()
                os.environ.update(run["env"])
                code = main(list(run["argv"]))
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        codes.append(os.waitstatus_to_exitcode(status))
    print(json.dumps(codes))
    return 0 if not any(codes) else 1


def drive_forked(python: Path, driver: Path, runs: list[tuple[list[str], dict[str, str]]], folder: Path,
                 timeout: float = 900) -> list[tuple[int, str]]:  # fmt: skip
    """Run `driver` once with `--runs`, the runs given as (argv, environment), in `python`: each run's exit code
    and standard error, in order (the spec and the standard errors are written into `folder`)."""
    folder.mkdir(parents=True, exist_ok=True)
    spec = [{"argv": argv, "env": env, "stderr": str(folder / f"run-{i}.stderr")} for i, (argv, env) in enumerate(runs)]
    path = folder / "runs.json"
    path.write_text(json.dumps(spec))
    proc = subprocess.run([str(python), str(driver), "--runs", str(path)], capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip
    lines = proc.stdout.strip().splitlines()
    assert lines and lines[-1].startswith("["), (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    codes = json.loads(lines[-1])
    assert len(codes) == len(runs), (codes, proc.stderr[-3000:])
    return [(code, Path(run["stderr"]).read_text(errors="replace")) for code, run in zip(codes, spec)]


def forked_results(
    python: Path, driver: Path, runs: dict[str, tuple[list[str], dict[str, str], Path]], folder: Path
) -> dict[str, dict]:
    """`drive_forked` of named runs, each (argv, environment, the result JSON it writes): every run's result with
    its standard error (`stderr`), by name. A run that exited non-zero or whose result is not `ok` fails the
    calling test, named, with its error and the end of its standard error."""
    outcomes = drive_forked(python, driver, [(argv, env) for argv, env, _ in runs.values()], folder)
    results = {}
    for (name, (_, _, out)), (code, stderr) in zip(runs.items(), outcomes):
        result = json.loads(out.read_text()) if out.is_file() else {"ok": False, "error": "no result written"}
        assert code == 0 and result["ok"], (name, code, result.get("error"), stderr[-3000:])
        result["stderr"] = stderr
        results[name] = result
    return results
