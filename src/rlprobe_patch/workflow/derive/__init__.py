"""`script` and `check-script`: a collection script derived from a training script, and its check.

One adapter per training framework (`base.Framework`), chosen once from `FRAMEWORKS` by the
launch the script runs (`Script.framework`):

- `verl.Verl`: `python3 -m verl.trainer.main_ppo` and its Hydra overrides;
- `slime.Slime`: slime's `train.py` and its argparse flags.

A third framework is one module with a `Framework` subclass, a line in `FRAMEWORKS`, and the
reader of its launch in `launch/`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlprobe_patch.base.errors import PatchError, RefusedError
from rlprobe_patch.base.interpreter import packages
from rlprobe_patch.catalogue.trees import find_verl_tree
from rlprobe_patch.launch.model import Script, is_true
from rlprobe_patch.workflow.derive.base import (
    Change,
    Framework,
    Requirements,
    RunOptions,
    ScriptCheck,
    capture_folder,
    capture_output,
    common_checks,
    default_output,
    shared_switches,
    write_script,
)
from rlprobe_patch.workflow.derive.slime import Slime
from rlprobe_patch.workflow.derive.verl import Verl
from rlprobe_patch.workflow.detect import Detection, cwd_dependent, detect_script
from rlprobe_patch.workflow.engines import COMMUNITY, vllm_engine

__all__ = [
    "FRAMEWORKS",
    "Change",
    "Framework",
    "Requirements",
    "RunOptions",
    "ScriptCheck",
    "capture_output",
    "capture_run",
    "check_script",
    "checked_requirements",
    "consistency_settings",
    "default_output",
    "derive",
    "framework_of",
    "render_script",
    "requirements",
    "script_config_paths",
    "shared_switches",
    "verl_tree_of",
    "write_script",
]

FRAMEWORKS: dict[str, Framework] = {framework.name: framework for framework in (Verl(), Slime())}


def framework_of(script: Script) -> Framework:
    return FRAMEWORKS[script.framework]


def requirements(detection: Detection, mode: str, options: RunOptions | None = None) -> Requirements:
    """What a `mode` collection run of the detected script needs (`Framework.requirements`)."""
    return framework_of(detection.script).requirements(detection, mode, options or RunOptions())


def render_script(script: Script, req: Requirements, source_name: str, composed: bool) -> tuple[str, list[Change]]:
    return framework_of(script).render(script, req, source_name, composed)


def capture_run(script: Script, req: Requirements) -> Requirements | None:
    """The log-prob capture run of a consistency collection (`Framework.capture_run`), None in other modes;
    its `MISMATCH_DIR` is an absolute path (`capture_folder`)."""
    if req.mode != "consistency" or req.capture:
        return None
    capture = framework_of(script).capture_run(req)
    folder = capture_folder(script)
    if capture is not None and folder is not None:
        capture.env["MISMATCH_DIR"] = folder
    return capture


def is_capture_script(script: Script) -> bool:
    """A script that runs the log-prob capture (MISMATCH_ON on) and no dump (DUMP_ON off or unset)."""
    on = script.env.get("MISMATCH_ON")
    dump = script.env.get("DUMP_ON")
    return on is not None and is_true(on.value) and (dump is None or not is_true(dump.value))


def checked_requirements(script: Script, req: Requirements) -> Requirements:
    """What check-script holds `script` to: the capture run's requirements where it is a consistency
    collection's capture run, else `req`."""
    capture = capture_run(script, req)
    return capture if capture is not None and is_capture_script(script) else req


def check_script(script: Script, req: Requirements) -> list[ScriptCheck]:
    framework = framework_of(script)
    checks = framework.check(script, req) + req.checks + common_checks(script, req, framework)
    if capture_run(script, req) is not None:  # a dump run: its capture run beside it
        companion = capture_output(script.path)
        detail = (
            str(companion)
            if companion.is_file()
            else (
                f"no such file: {companion}: the dump run cuts its batches to their prompts (PROMPTS_ONLY), so "
                "the log-prob capture for `report` is a second run; rlprobe-patch script ORIGINAL --mode consistency "
                "writes it beside the dump script"
            )
        )
        checks.append(ScriptCheck("log-prob capture run", companion.is_file(), detail))
    return checks


def script_config_paths(script: Script, mode: str) -> dict[str, str]:
    return framework_of(script).config_paths(script, mode)


def verl_tree_of(verl_root: Path | None, python: str | None) -> tuple[Path | None, str | None]:
    """(root, version) of the verl tree the values are composed with, when one is named."""
    if verl_root is None and python is None:
        return None, None
    tree = find_verl_tree(verl_root, python)
    return tree.root, str(tree.version)


def derive(
    script: Path,
    *,
    mode: str | None,
    hint: str = "",
    verl_root: Path | None = None,
    python: str | None = None,
    args: list[str] | None = None,
    env: dict[str, str] | None = None,
    sets: tuple[str, ...] = (),
    train_backend: str | None = None,
    rollout_backend: str | None = None,
    n_gpus: int | None = None,
    configs: dict[str, str] | None = None,
    stages: tuple[str, ...] = (),
    save_path: str | None = None,
    sglang_version: str | None = None,
    vllm_ascend_version: str | None = None,
    vllm_version: str | None = None,
    cwd: Path | None = None,
) -> tuple[Detection, Requirements, Path | None]:
    """Read `script` (composed with the verl tree named, if any) and work out what its `mode`
    collection run needs: (detection, requirements, the verl root composed with).

    The configs are those given, else the ones the script already names (checked, not added);
    the stages those given, else the script's, else the ones this run has (`verl.roles_of`).
    Refused when verl would refuse the launch's overrides, or when the mode is unknown."""
    versions: dict[str, str | None] = {}
    root, versions["verl"] = verl_tree_of(verl_root, python)
    detection = detect_script(
        script,
        hint,
        verl_root=root,
        release=versions["verl"],
        extra=list(sets),
        args=args,
        env=env,
        cwd=cwd,
        python=python,
    )
    composed = detection.script.composed
    if composed is not None and composed.errors and cwd_dependent(detection.script):
        raise RefusedError(
            f"{script}: verl would not find its config run from {(cwd or Path.cwd()).absolute()}",
            details=composed.errors,
            hint="the script names its config relative to the directory it runs from: say where it runs with "
            "--cwd DIR (the verl checkout), or pass --verl-root with the checkout holding the script",
        )
    if composed is not None and composed.errors:
        raise RefusedError(
            f"{script}: verl would refuse this launch (Hydra cannot compose its overrides)",
            details=composed.errors,
            hint="fix the override named; verl stops on it at start-up",
        )
    mode = mode or detection.mode
    if mode == "unknown":
        raise RefusedError(
            f"{script}: the collection mode is unknown", hint="pass --mode training|inference|consistency"
        )
    found = None
    if python is not None:
        try:
            found, _ = packages(python)
            versions["sglang"] = found["sglang"].version
            versions["vllm_ascend"] = found["vllm_ascend"].version
        except PatchError:
            found = None
    if sglang_version:
        versions["sglang"] = sglang_version
    if vllm_ascend_version:
        versions["vllm_ascend"] = vllm_ascend_version
    engine = vllm_engine(found, python, vllm_version, vllm_ascend_version)
    versions["vllm"] = engine.version if engine.kind == COMMUNITY else None
    found_configs = script_config_paths(detection.script, mode)
    found_configs.update(configs or {})
    if not stages:
        in_script = detection.script.get("precision_debugger.stages")
        stages = tuple(in_script.value) if in_script is not None and isinstance(in_script.value, list) else ()
    options = RunOptions(
        train_backend, rollout_backend, n_gpus, found_configs, versions, stages, save_path, engine, python
    )
    req = requirements(detection, mode, options)
    req.pinned = dict(env or {})
    reading = detection.script.reading
    for name, probe in reading.probed.items():
        if name in req.pinned:
            continue
        if probe.keeps or probe.line_end is not None:
            req.probes[name] = probe
        else:
            req.notices.append(
                f"{name}={probe.value} ({probe.where}) is an import probe answered by {reading.python}, in a sourced "
                "file or on a line shared with other commands, so the derived script cannot pin it: bash asks the "
                "Python on the machine that runs the script again, which may answer otherwise (derive with that "
                "--python, or pass --env to set what it decides)"
            )
    return detection, req, root


def consistency_settings(script: str, keys: frozenset[str]) -> tuple[frozenset[str], dict[str, Any]] | None:
    """What a plain consistency collection script of `script` sets (the keys of its settings), and the values
    `script` runs with for `keys`, read as `rlprobe-patch script SCRIPT --mode consistency` reads it; None where
    no consistency script can be derived from it (the report's confirming runs: `report.confirm`)."""
    try:
        detection, req, _ = derive(Path(script), mode="consistency")
    except PatchError:
        return None
    if req.refusals or req.blocked:
        return None
    return frozenset(r.key for r in req.settings), {k: detection.script.value(k) for k in keys}
