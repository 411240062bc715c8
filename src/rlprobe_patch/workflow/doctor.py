"""`doctor`: can the training interpreter run msprobe, and what else is there.

The skill's first step (`ensure-msprobe-env.sh`): msprobe must import in the same Python that
runs verl, before any config, script or patch work. `--install` runs
`<python> -m pip install mindstudio-probe` there and checks again.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from typing import Any

from packaging.version import Version

from rlprobe_patch.base.errors import PatchError
from rlprobe_patch.base.interpreter import Package, interpreter, msprobe_import, packages
from rlprobe_patch.catalogue.releases import releases
from rlprobe_patch.catalogue.trees import find_verl_tree
from rlprobe_patch.core.status import status
from rlprobe_patch.workflow.engines import vllm_engine

MSPROBE_REQUIREMENT = "mindstudio-probe"


@dataclass
class DoctorReport:
    python: dict[str, str]
    msprobe: dict[str, Any]
    packages: dict[str, Package]
    verl: dict[str, Any]
    patches: list[dict[str, Any]] = field(default_factory=list)
    install: dict[str, Any] | None = None
    advice: list[str] = field(default_factory=list)  # what to do when msprobe does not import
    rollout: dict[str, Any] = field(default_factory=dict)  # the engines there and whether each dumps

    @property
    def ok(self) -> bool:
        return bool(self.msprobe.get("ok"))

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "python": self.python,
            "msprobe": {k: v for k, v in self.msprobe.items() if k != "traceback"},
            "packages": {name: p.to_json() for name, p in self.packages.items()},
            "verl": self.verl,
            "patches": self.patches,
            "rollout": self.rollout,
            "install": self.install,
            "advice": self.advice,
        }


def pip_install(python: str | None, requirement: str, extra_args: tuple[str, ...] = ()) -> dict[str, Any]:
    cmd = [interpreter(python), "-m", "pip", "install", "--disable-pip-version-check", *extra_args, requirement]
    proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=1800)
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
    return {"command": cmd, "exit_code": proc.returncode, "ok": proc.returncode == 0, "output_tail": tail}


def run_doctor(
    python: str | None,
    *,
    install: bool = False,
    requirement: str = MSPROBE_REQUIREMENT,
    pip_args: tuple[str, ...] = (),
    progress: Any = None,
) -> DoctorReport:
    say = progress or (lambda _: None)
    say(f"checking msprobe in {interpreter(python)}")
    found, info = packages(python)
    msprobe = msprobe_import(python) if found["msprobe"].found else {"ok": False, "error": "msprobe is not installed"}
    install_result = None
    if install and not msprobe.get("ok"):
        say(f"pip install {requirement} (in {interpreter(python)})")
        install_result = pip_install(python, requirement, pip_args)
        found, info = packages(python)
        msprobe = msprobe_import(python) if found["msprobe"].found else {"ok": False, "error": "still not installed"}
    advice = []
    if not msprobe.get("ok") and found["msprobe"].found and not found["torch"].found:
        # msprobe imports torch, the torch of the environment it is installed in: there is none here
        advice.append(
            f"msprobe needs the training environment's torch, and {interpreter(python)} has no torch: install "
            f"msprobe into the Python that runs verl (with its torch): <that python> -m pip install {requirement}, "
            "or rlprobe-patch doctor --install --python <that python>"
        )
    verl: dict[str, Any]
    patches: list[dict[str, Any]] = []
    try:
        tree = find_verl_tree(None, python)
        verl = {"found": True, **tree.to_json()}
        try:
            result = status(tree)
            patches = [{"id": p.patch.id, "state": p.state_name, "skipped": p.skipped or None} for p in result.patches]
        except PatchError as exc:
            verl["status_error"] = exc.message
    except PatchError as exc:
        verl = {"found": False, "reason": exc.message}
    return DoctorReport(info, msprobe, found, verl, patches, install_result, advice, rollout_engines(found, python))


def rollout_engines(found: dict[str, Package], python: str | None) -> dict[str, Any]:
    """The rollout engines `python` has, each with whether it dumps with msprobe there."""
    engines: dict[str, Any] = {}
    if found["vllm"].found or found["vllm_ascend"].found:
        engine = vllm_engine(found, python)
        engines["vllm"] = {**engine.to_json(), "says": engine.describe()}
    if found["sglang"].found:
        sglang = found["sglang"].version
        native = releases("sglang").native
        dumps = sglang is not None and releases("sglang").is_native(Version(sglang))
        says = (
            f"SGLang {sglang}: dumps with msprobe itself (--msprobe-dump-config)"
            if dumps
            else f"SGLang {sglang or '?'}: dumps only with the catalogue's SGLang patches (native from {native})"
        )
        engines["sglang"] = {"kind": "sglang", "version": sglang, "dumps": dumps, "says": says}
    return engines
