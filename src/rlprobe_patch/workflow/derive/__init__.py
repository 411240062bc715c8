"""`script` and `check-script`: a collection script derived from a training script, and its check.

One adapter per training framework (`base.Framework`), chosen once from `FRAMEWORKS` by the
launch the script runs (`Script.framework`):

- `verl.Verl`: `python3 -m verl.trainer.main_ppo` and its Hydra overrides;
- `slime.Slime`: slime's `train.py` and its argparse flags.

A third framework is one module with a `Framework` subclass, a line in `FRAMEWORKS`, and the
reader of its launch in `launch/`.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rlprobe_patch.base.errors import PatchError, RefusedError
from rlprobe_patch.base.interpreter import packages
from rlprobe_patch.catalogue.trees import find_verl_tree
from rlprobe_patch.launch.model import Script, is_true
from rlprobe_patch.launch.script import ReaderOptions
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
    "CollectOptions",
    "Framework",
    "Requirements",
    "RunOptions",
    "ScriptCheck",
    "capture_output",
    "capture_run",
    "check_given_configs",
    "check_script",
    "checked_requirements",
    "consistency_settings",
    "default_output",
    "derive",
    "framework_of",
    "refuse_blocked",
    "refuse_underivable",
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
    """The rules of `req`'s mode held against `script`: the framework's, the mode's, and the dump configs and the
    capture run a collection needs."""
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
    return checks + _missing_dump_configs(script, req, framework)


def _missing_dump_configs(script: Script, req: Requirements, framework: Framework) -> list[ScriptCheck]:
    """A rollout side with no dump config (an SGLang rollout hooked by the model-runner patch reads its own), and
    training without verl's precision_debugger config."""
    missing = []
    if req.mode in ("inference", "consistency") and not req.capture and "generate" not in req.configs:
        if not (req.rollout_backend == "sglang" and any("ModelRunner" in n for n in req.notices)):
            missing.append(
                ScriptCheck("rollout dump config", False, f"no {framework.dump_config_arg} argument in the script")
            )
    if req.mode == "training" and "training" not in req.configs:
        missing.append(
            ScriptCheck("precision_debugger.config_path", False, "not set (global_tool_config.precision_debugger)")
        )
    return missing


def check_given_configs(configs: Mapping[str, str], cwd: Path | None) -> None:
    """Each msprobe config given (side -> path) must be there: the run's processes read it from the directory
    the script runs in (`cwd`, else this one), where a relative path is resolved."""
    base = cwd if cwd is not None else Path.cwd()
    for side, given in configs.items():
        if not (base / given).is_file():
            raise RefusedError(
                f"--{side}-config {given}: no such file" + (f" (in {base})" if not Path(given).is_absolute() else ""),
                hint=f"write it with rlprobe-patch config, or leave --{side}-config out: script then writes one beside "
                "the collection script",
            )


def refuse_blocked(script: Path, req: Requirements) -> None:
    """A run no option can make collectable in this mode: refused (exit 3) before any rule is checked."""
    if req.blocked:
        raise RefusedError(
            f"{script}: no {req.mode} collection is possible for this run",
            details=[req.blocked],
            hint="run the rollout on a backend msprobe dumps (vllm, sglang), or collect with --mode training",
        )


def refuse_underivable(original: Path, req: Requirements, invocation: list[str], given_sets: tuple[str, ...]) -> None:
    """Refuse a collection script `req` cannot give (its refusals), naming the fixes; where a fix is a `--set`,
    the command to run instead: `invocation` (the command as given) with those `--set`s added."""
    if not req.refusals:
        return
    fixes = [f for f in dict.fromkeys(req.fixes) if f.startswith("--set")]
    others = [f for f in req.fixes if not f.startswith("--set")]
    hint = "nothing was written"
    if fixes:
        sets = [word for fix in fixes for word in shlex.split(fix) if word != "--set" and word not in set(given_sets)]
        rerun = [*invocation, *(word for item in sets for word in ("--set", item))]
        instead = f" (or with {' / '.join(others)} instead of the --set options)" if others else ""
        hint += f"; to collect with these values{instead}, run: {shlex.join(rerun)}"
    raise RefusedError(f"{original}: cannot derive a {req.mode} collection script", details=req.refusals, hint=hint)


def script_config_paths(script: Script, mode: str) -> dict[str, str]:
    return framework_of(script).config_paths(script, mode)


def verl_tree_of(verl_root: Path | None, python: str | None) -> tuple[Path | None, str | None]:
    """(root, version) of the verl tree the values are composed with, when one is named."""
    if verl_root is None and python is None:
        return None, None
    tree = find_verl_tree(verl_root, python)
    return tree.root, str(tree.version)


@dataclass(frozen=True)
class CollectOptions:
    """What the collection script is asked for besides its mode (the options of `script` and `check-script`);
    each left out is what the launch script says, else what the run has."""

    train_backend: str | None = None
    rollout_backend: str | None = None
    n_gpus: int | None = None  # training GPUs in all
    configs: Mapping[str, str] = field(default_factory=dict)  # side (actor, generate, training) -> msprobe config
    stages: tuple[str, ...] = ()  # training mode's stages
    save_path: str | None = None  # training mode's global_profiler.save_path
    sglang_version: str | None = None
    vllm_ascend_version: str | None = None
    vllm_version: str | None = None


def derive(
    script: Path,
    mode: str | None,
    reader: ReaderOptions = ReaderOptions(),
    collect: CollectOptions = CollectOptions(),
    hint: str = "",
) -> tuple[Detection, Requirements, Path | None]:
    """Read `script` (composed with the verl tree named, if any) and work out what its `mode`
    collection run needs: (detection, requirements, the verl root composed with).

    The configs are those given, else the ones the script already names (checked, not added);
    the stages those given, else the script's, else the ones this run has (`verl.roles_of`).
    Refused when verl would refuse the launch's overrides, or when the mode is unknown."""
    python = reader.python
    versions: dict[str, str | None] = {}
    root, versions["verl"] = verl_tree_of(reader.verl_root, python)
    detection = detect_script(script, hint, replace(reader, verl_root=root, release=versions["verl"]))
    composed = detection.script.composed
    if composed is not None and composed.errors and cwd_dependent(detection.script):
        raise RefusedError(
            f"{script}: verl would not find its config run from {(reader.cwd or Path.cwd()).absolute()}",
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
    if collect.sglang_version:
        versions["sglang"] = collect.sglang_version
    if collect.vllm_ascend_version:
        versions["vllm_ascend"] = collect.vllm_ascend_version
    engine = vllm_engine(found, python, collect.vllm_version, collect.vllm_ascend_version)
    versions["vllm"] = engine.version if engine.kind == COMMUNITY else None
    found_configs = script_config_paths(detection.script, mode)
    found_configs.update(collect.configs)
    stages = collect.stages
    if not stages:
        in_script = detection.script.get("precision_debugger.stages")
        stages = tuple(in_script.value) if in_script is not None and isinstance(in_script.value, list) else ()
    options = RunOptions(
        collect.train_backend,
        collect.rollout_backend,
        collect.n_gpus,
        found_configs,
        versions,
        stages,
        collect.save_path,
        engine,
        python,
    )
    req = requirements(detection, mode, options)
    req.pinned = dict(reader.env)
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
        detection, req, _ = derive(Path(script), "consistency")
    except PatchError:
        return None
    if req.refusals or req.blocked:
        return None
    return frozenset(r.key for r in req.settings), {k: detection.script.value(k) for k in keys}
