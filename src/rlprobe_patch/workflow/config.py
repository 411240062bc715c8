"""`config`: an msprobe config.json with the skill's rules per mode and side, checked by msprobe.

Rules (SKILL.md "共用 config.json 规范" and the three-mode table):

| mode        | side      | dump_path | step  |
|-------------|-----------|-----------|-------|
| training    | training  | forbidden (verl's precision_debugger profiler sets it per stage) | [] |
| inference   | generate  | required  | [0]   |
| consistency | generate  | required  | []    |
| consistency | actor     | required (the patched hook logs next to it) | [] |

The consistency generate side dumps every step (`[]`): the rollout's msprobe step is one forward
pass (SGLang's debugger, `vllm.model-runner`, vLLM-Ascend's runner), and check-dump pairs each
single-request prefill pass with its actor step (issue 35, item 2: `[0]` dumped one pass).

`"level": "mix"` unless asked otherwise. The file is then loaded by msprobe itself, in the
training interpreter: `parse_json_config` (msprobe's CommonConfig and task config checks) and
`DebuggerConfig` (what `PrecisionDebugger(config_path=...)` builds), so a config this command
writes is one msprobe accepts.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from rlprobe_patch.base.errors import RefusedError
from rlprobe_patch.base.interpreter import interpreter, last_json, run_probe
from rlprobe_patch.workflow.pairing import GENERATE_STEPS, GENERATE_STEPS_WHY

SIDES = {"training": ("training",), "inference": ("generate",), "consistency": ("actor", "generate")}
LEVELS = ("mix", "L0", "L1", "L2", "debug")
TASKS = ("statistics", "tensor")
# verl's precision_debugger profiler passes its own dump_path (save_path/step_N/stage); the
# check stands in for it so that msprobe's "dump_path not found" rule is exercised on the rest.
TRAINING_DUMP_PATH_STAND_IN = "<global_profiler.save_path>/step_N/<stage>"


class ConfigError(RefusedError):
    pass


class MsprobeMissing(ConfigError):
    """msprobe cannot load the config in that interpreter (not installed, or it does not import): nothing
    judged it. `script`, writing its own configs, writes them unchecked and says so."""


def build_config(
    mode: str,
    side: str,
    dump_path: str | None,
    *,
    level: str = "mix",
    task: str = "statistics",
    steps: list[int] | None = None,
    ranks: list[int] | None = None,
    rollout_backend: str | None = None,
    request_id: str | None = None,
) -> dict[str, Any]:
    if side not in SIDES[mode]:
        raise ConfigError(
            f"--side {side} does not belong to --mode {mode}",
            hint=f"{mode} configs are for: {', '.join(SIDES[mode])}",
        )
    if mode == "training" and dump_path:
        raise ConfigError(
            "dump_path is forbidden in a training-profiler config",
            hint="verl's precision_debugger writes each stage to global_profiler.save_path/step_N/<stage>; "
            "set global_profiler.save_path in the script instead",
        )
    if mode != "training" and not dump_path:
        raise ConfigError(
            f"--dump-path is required for a {mode} {side} config",
            hint="use a different folder per side (actor / generate) and per PD role",
        )
    if request_id and side != "generate":
        raise ConfigError(
            f"--request-id is for the generate side; this is the {side} side",
            hint="the training side dumps the micro-batches that carry the request (its request ids are logged)",
        )
    if request_id and level not in ("L0", "L1", "mix"):
        raise ConfigError(f"--request-id needs --level L0, L1 or mix (msprobe slices those dumps); got {level}")
    config: dict[str, Any] = {"task": task}
    if dump_path:
        config["dump_path"] = str(dump_path)
    default_step = [0] if side == "generate" else []
    if consistency_generate(mode, side) or request_id:
        # every pass: the request's prefill is not the engine's first step
        default_step = list(GENERATE_STEPS)
    config.update(
        {
            "rank": list(ranks or []),
            "step": list(steps if steps is not None else default_step),
            "level": level,
            "async_dump": False,
            "extra_info": True,
        }
    )
    config[task] = {
        "scope": [],
        "list": [],
        **({"tensor_list": []} if task == "statistics" else {}),
        "data_mode": ["all"],
        "summary_mode": "statistics",
    }
    if task == "tensor":
        del config[task]["summary_mode"]
    if request_id:
        # msprobe dumps only this request's rows of each step that holds it (and skips the others),
        # given the tokens per request (community vLLM's patched model runner passes them).
        config[task]["request_id"] = request_id
    return config


def check_with_msprobe(path: Path, python: str | None, *, training: bool) -> dict[str, Any]:
    """Load `path` with msprobe's own config parsing in `python`; {"ok", ...} or {"ok": False, "error"}."""
    proc = run_probe(python, "msprobe_config", str(path), TRAINING_DUMP_PATH_STAND_IN if training else "")
    result = last_json(proc, f"msprobe config check in {interpreter(python)}")
    if result.get("msprobe") is None and not result["ok"]:
        raise MsprobeMissing(
            f"msprobe is not installed in {interpreter(python)}: cannot check the config with msprobe",
            hint=(
                f"install it into that environment (rlprobe-patch doctor --install --python {python})"
                if python
                else "pass the training interpreter with --python, install msprobe there (rlprobe-patch doctor "
                "--install --python <the training python>: msprobe imports that environment's torch)"
            )
            + ", or skip the check with --no-check",
        )
    return result


def write_config(config: dict[str, Any], output: Path, python: str | None, *, check: bool) -> dict[str, Any] | None:
    """Write `config` to `output` (temp file, checked by msprobe, then renamed into place)."""
    output = Path(output)
    if output.is_dir():
        raise ConfigError(f"-o {output}: is a directory", hint="name the file, e.g. -o config_actor.json")
    if not output.parent.is_dir():
        raise ConfigError(f"-o {output}: folder {output.parent} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{output.name}.", suffix=".tmp", dir=output.parent)
    except OSError as exc:  # the file asked for is what cannot be written, not our temporary name beside it
        raise OSError(exc.errno, exc.strerror, str(output)) from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
        os.chmod(tmp, 0o640)  # msprobe refuses config files that others may write
        result = None
        if check:
            result = check_with_msprobe(Path(tmp), python, training="dump_path" not in config)
            if not result["ok"] and result.get("stage") == "import":  # msprobe judged nothing
                raise MsprobeMissing(
                    f"msprobe {result.get('msprobe')} could not be imported in {interpreter(python)}, so the config "
                    f"was not checked: {result['error']}",
                    details=result.get("log", []),
                    hint="nothing was written; rlprobe-patch doctor"
                    + (f" --python {python}" if python else "")
                    + " says why (msprobe needs that environment's torch), or skip the check with --no-check",
                )
            if not result["ok"]:
                raise ConfigError(
                    f"msprobe {result.get('msprobe')} rejects the config: {result['error']}",
                    details=result.get("log", []),
                    hint="nothing was written",
                )
        os.replace(tmp, output)
        return result
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


# The mode each side's config is written for, in a collection of `mode` (consistency's generate side in training).
def side_mode(mode: str, side: str) -> str:
    return {"actor": "consistency", "training": "training"}.get(side, "consistency" if mode == "training" else mode)


def config_beside(script: Path, side: str) -> Path:
    """Where `script` writes a side's msprobe config it was not given: beside the collection script."""
    return script.with_name(f"{script.stem}.{side}.json")


def dump_beside(script: Path, side: str) -> Path:
    """The dump_path of a config `script` writes: a folder per side beside the collection script, absolute
    (the run's processes read it from wherever they run)."""
    return script.absolute().with_name(f"{script.stem}.dump") / side


def write_side_config(
    mode: str, side: str, script: Path, python: str | None, rollout_backend: str | None
) -> tuple[dict[str, Any] | None, str]:
    """The msprobe config of `side` that the `mode` collection script `script` names, written beside it
    (`config_beside`) with `config`'s rules: (msprobe's check, or None and why msprobe could not check it)."""
    wanted = side_mode(mode, side)
    dump = None if wanted == "training" else str(dump_beside(script, side))
    data = build_config(wanted, side, dump, rollout_backend=rollout_backend)
    output = config_beside(script, side)
    try:
        return write_config(data, output, python, check=True), ""
    except MsprobeMissing as exc:
        write_config(data, output, python, check=False)
        return None, exc.message


def read_config(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such msprobe config") from None
    except ValueError as exc:
        raise ConfigError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: not a JSON object")
    return data


# check-script shows a problem starting with this as a warning (the run dumps, but pairs less).
SGLANG_STEP_WARNING = "step selects SGLang forward passes"


def consistency_generate(mode: str, side: str) -> bool:
    return mode == "consistency" and side == "generate"


def steps_why(rollout_backend: str | None) -> str:
    """Why the consistency generate side dumps every step, for `rollout_backend`."""
    return GENERATE_STEPS_WHY.get(rollout_backend or "", GENERATE_STEPS_WHY["vllm"].replace("vLLM", "the rollout"))


def rule_problems(data: dict[str, Any], mode: str, side: str, rollout_backend: str | None = None) -> list[str]:
    """The skill's rules for an existing config (used by check-script)."""
    problems = []
    if mode == "training" and "dump_path" in data:
        problems.append("dump_path is set; it is forbidden for the training profiler (verl sets it per stage)")
    if mode != "training" and not data.get("dump_path"):
        problems.append(f"dump_path is missing; it is required for the {side} side")
    if consistency_generate(mode, side):
        if data.get("step", []) != GENERATE_STEPS:
            problem = f"step is {data.get('step')!r}, so only those passes are dumped and paired"
            if rollout_backend == "sglang":
                problems.append(f"{SGLANG_STEP_WARNING}: {problem} ({steps_why(rollout_backend)})")
            else:
                backend = f" --rollout-backend {rollout_backend}" if rollout_backend else ""
                problems.append(
                    f"{problem} ({steps_why(rollout_backend)}); fix: step [] (rlprobe-patch config --mode "
                    f"consistency --side generate{backend} writes it)"
                )
    elif side == "generate" and data.get("step") not in ([0],):
        problems.append(f"step is {data.get('step')!r}; the generate side uses [0]")
    if data.get("level", "L1") != "mix":
        problems.append(f'level is {data.get("level", "L1 (default)")!r}; the skill uses "mix" unless asked otherwise')
    return problems
