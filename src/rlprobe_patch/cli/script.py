"""`rlprobe-patch script` and `check-script`: a collection script derived from a training script, and its check."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import click

from rlprobe_patch.base.errors import ExitCode, RefusedError, UsageError
from rlprobe_patch.cli.options import cwd_option, python_option, read_options, reader_options, verl_root_option
from rlprobe_patch.cli.output import Out, command
from rlprobe_patch.cli.paths import CheckedPath
from rlprobe_patch.workflow.config import SIDES, config_beside, write_side_config
from rlprobe_patch.workflow.derive import (
    ScriptCheck,
    capture_output,
    capture_run,
    check_script,
    checked_requirements,
    default_output,
    derive,
    framework_of,
    render_script,
    write_script,
)
from rlprobe_patch.workflow.detect import COLLECTION_MODES


def _script_options(fn: Any) -> Any:
    options: list[Any] = [
        click.option("--mode", type=click.Choice(COLLECTION_MODES), help="Default: the mode detect finds."),
        click.option("--train-backend", type=click.Choice(["fsdp", "fsdp2", "megatron"]), help="Default: detected."),
        click.option("--rollout-backend", type=click.Choice(["vllm", "sglang"]), help="Default: detected."),
        click.option("--n-gpus", type=click.IntRange(min=1), help="Training GPUs in all (default: from the script)."),
        click.option(
            "--actor-config", metavar="PATH", help="msprobe config of the engine hook (MSPROBE_ACTOR_CONFIG)."
        ),
        click.option("--generate-config", metavar="PATH", help="msprobe config of the rollout side."),
        click.option("--training-config", metavar="PATH", help="msprobe config of verl's precision_debugger."),
        click.option(
            "--stages",
            help="Training-mode stages, comma-separated (default: the script's, else the ones this run has: "
            "the roles it runs, the stages that dump on its verl release).",
        ),
        click.option("--save-path", metavar="DIR", help="Training mode: global_profiler.save_path."),
        click.option("--sglang-version", metavar="V", help="Default: the one --python imports."),
        click.option("--vllm-ascend-version", metavar="V", help="Default: the one --python imports."),
        click.option(
            "--vllm-version",
            metavar="V",
            help="Community vLLM's release, where the run has no vLLM-Ascend (default: the one --python imports); "
            "it dumps through the catalogue's vLLM model-runner patch.",
        ),
        verl_root_option,
        python_option,
        click.option("--hint", default="", help="As for detect."),
        reader_options,
        cwd_option,
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _derive(script: Path, opts: dict[str, Any]) -> tuple[Any, Any, Path | None]:
    """(detection, requirements, verl root) of SCRIPT under the options `_script_options` define."""

    reader = read_options(opts)
    stages = tuple(s.strip() for s in opts["stages"].split(",") if s.strip()) if opts["stages"] else ()
    return derive(
        script,
        mode=opts["mode"],
        hint=opts["hint"],
        verl_root=opts["verl_root"],
        python=opts["python"],
        args=reader["args"],
        env=reader["env"],
        sets=tuple(opts.get("sets", ())),
        train_backend=opts["train_backend"],
        rollout_backend=opts["rollout_backend"],
        n_gpus=opts["n_gpus"],
        configs={
            side: opts[f"{side}_config"] for side in ("actor", "generate", "training") if opts.get(f"{side}_config")
        },
        stages=stages,
        save_path=opts["save_path"],
        sglang_version=opts["sglang_version"],
        vllm_ascend_version=opts["vllm_ascend_version"],
        vllm_version=opts["vllm_version"],
        cwd=opts["cwd"],
    )


# The options of `_script_options` that say how the script is read (not what to collect): `script`'s
# `next:` line passes them on to check-script, so that it reads the derived script the same way.
_READER_FLAGS = (
    ("verl_root", "--verl-root"),
    ("python", "--python"),
    ("train_backend", "--train-backend"),
    ("rollout_backend", "--rollout-backend"),
    ("sglang_version", "--sglang-version"),
    ("vllm_ascend_version", "--vllm-ascend-version"),
    ("vllm_version", "--vllm-version"),
    ("hint", "--hint"),
    ("script_env", "--env"),
    ("script_args", "--arg"),
    ("cwd", "--cwd"),
)


def _invocation() -> list[str]:
    """This command's line as given (arguments and the options not left at their default), to print
    a command that works as printed."""
    ctx = click.get_current_context()
    words = ["rlprobe-patch", str(ctx.info_name)]
    for param in ctx.command.params:
        value = ctx.params.get(str(param.name))
        if isinstance(param, click.Argument):
            words.append(str(value))
            continue
        if param.name == "as_json" or value in (None, False, (), "") or value == param.default:
            continue
        flag = max(param.opts, key=len)
        if isinstance(param, click.Option) and param.is_flag:
            words.append(flag)
        else:
            for item in value if isinstance(value, tuple) else (value,):
                words += [flag, str(item)]
    return words


def _reader_flags(opts: dict[str, Any]) -> list[str]:
    flags: list[str] = []
    for name, flag in _READER_FLAGS:
        value = opts.get(name)
        for item in value if isinstance(value, tuple) else (value,):
            if item not in (None, ""):
                flags += [flag, str(item)]
    return flags


@click.command("script")
@click.argument("original", type=CheckedPath("file"))
@_script_options
@click.option("-o", "--output", type=CheckedPath("new-file"), help="Default: run_<mode>_dump_<date>.sh beside it.")
@click.option("--force", is_flag=True, help="Replace OUTPUT if it exists.")
@click.option("--dry-run", is_flag=True, help="Print the new script; write nothing.")
@click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="KEY=VALUE",
    help="An override to add to the derived script (checked with the others); repeatable. "
    "For slime, FLAG=VALUE adds --FLAG VALUE.",
)
@command
def script_cmd(out: Out, original: Path, output: Path | None, force: bool, dry_run: bool, **opts: Any) -> int:
    """Write a collection script derived from ORIGINAL (never edited) with the skill's overrides."""

    for item in opts.get("sets", ()):
        if "=" not in item or item.startswith("-"):
            raise UsageError(f"--set {item!r}: expected a Hydra override KEY=VALUE")

    carried = _reader_flags(opts)  # before _derive takes --arg / --env out of opts
    _given_configs_exist(opts)
    detection, req, verl_root = _derive(original, dict(opts))
    _refuse_blocked(original, req)
    output = output or default_output(original, req.mode)
    # the msprobe configs neither given nor named by the script: written beside the collection script
    missing = [side for side in SIDES[req.mode] if side not in req.configs]
    if missing:
        opts.update({f"{side}_config": str(config_beside(output, side)) for side in missing})
        detection, req, verl_root = _derive(original, dict(opts))
    if req.refusals:
        fixes = [f for f in dict.fromkeys(req.fixes) if f.startswith("--set")]
        others = [f for f in req.fixes if not f.startswith("--set")]
        hint = "nothing was written"
        if fixes:
            given = set(opts.get("sets", ()))
            sets = [word for fix in fixes for word in shlex.split(fix) if word != "--set" and word not in given]
            rerun = [*_invocation(), *(word for item in sets for word in ("--set", item))]
            instead = f" (or with {' / '.join(others)} instead of the --set options)" if others else ""
            hint += f"; to collect with these values{instead}, run: {shlex.join(rerun)}"
        raise RefusedError(f"{original}: cannot derive a {req.mode} collection script", details=req.refusals, hint=hint)
    text, changes = render_script(detection.script, req, original.name, composed=verl_root is not None)
    # check-script reads the derived script as this command read the original: same tree, environment, arguments
    next_command = ["rlprobe-patch", "check-script", str(output), "--mode", req.mode, *carried]
    capture = capture_run(detection.script, req)
    captured: dict[str, Any] | None = None
    if capture is not None:  # the consistency collection's second run: the log-prob capture for `report`
        capture_text, capture_changes = render_script(detection.script, capture, original.name, verl_root is not None)
        capture_path = capture_output(output)
        captured = {
            "output": None if dry_run else str(capture_path),
            "changes": [c.to_json() for c in capture_changes],
            "env": capture.env,
            "notices": capture.notices,
            "text": capture_text if dry_run else None,
            "next": None if dry_run else [*next_command[:2], str(capture_path), *next_command[3:]],
        }
    configs: dict[str, dict[str, Any]] = {}
    if not dry_run:
        if captured is not None and capture_path.exists() and not force:  # refused before either is written
            write_script(original, capture_path, capture_text, force)
        for side in missing:
            path = config_beside(output, side)
            if path.exists() and not force:
                raise RefusedError(f"{path} exists", hint="pass --force to replace it, or give --{side}-config")
        for side in missing:
            checked, why = write_side_config(req.mode, side, output, opts["python"], req.rollout_backend)
            configs[side] = {"output": str(config_beside(output, side)), "msprobe_check": checked, "unchecked": why}
        write_script(original, output, text, force)
        if captured is not None:
            write_script(original, capture_path, capture_text, force)
    out.emit(
        {
            "ok": True,
            "original": str(original),
            "output": None if dry_run else str(output),
            "mode": req.mode,
            "train_backend": req.train_backend,
            "rollout_backend": req.rollout_backend,
            "changes": [c.to_json() for c in changes],
            "set": list(opts.get("sets", ())),
            "env": req.env,
            "pinned_env": req.pinned,
            "pinned_probes": {name: probe.value for name, probe in req.probes.items()},
            "notices": req.notices,
            "text": text if dry_run else None,
            "next": None if dry_run else next_command,
            "capture": captured,
            "configs": configs,
        }
    )
    for c in changes:
        where = f" (was {c.old} at {c.source})" if c.action in ("set", "removed") else ""
        if c.action == "set" and c.old is None and c.source and c.source.startswith("--set"):
            where = f" ({c.source})"
        colour = {"skipped": "yellow", "kept": None}.get(c.action, "green")
        out.line(f"  {c.action:<9} {c.key}={c.value}{where}", fg=colour)
    for name, value in req.env.items():
        out.line(f"  export    {name}={value}", fg="green")
    for name, value in req.pinned.items():
        out.line(f"  pinned    {name}={value} (--env: exported at the top, before the script's own lines)", fg="green")
    for name, probe in req.probes.items():
        how = "exported at the top" if probe.keeps else "assigned again on the line after it"
        out.line(
            f"  pinned    {name}={probe.value} (import probe at {probe.where}, answered by "
            f"{detection.script.reading.python}: {how})",
            fg="green",
        )
    for notice in req.notices:
        out.line(f"notice: {notice}", fg="yellow")
    if dry_run:
        out.line(text)
        if captured is not None:
            out.line(captured["text"])
    else:
        for side, written in configs.items():
            check = written["msprobe_check"]
            how = (
                f"loaded by msprobe {check.get('msprobe')}"
                if check
                else f"not checked by msprobe: {written['unchecked']}"
            )
            out.line(
                f"wrote {written['output']} (the {side} side's msprobe config, no --{side}-config given; {how})",
                fg="green" if check else "yellow",
            )
        out.line(f"wrote {output} ({req.mode}); {original} is unchanged", fg="green", bold=True)
        if captured is not None:
            out.line(
                f"wrote {captured['output']} (its log-prob capture run, for report: the same launch without the dump, "
                "MISMATCH_ON=1; the dump run cuts its batches to their prompts and cannot capture)",
                fg="green",
                bold=True,
            )
        out.line(f"next: {shlex.join(next_command)}")
        if captured is not None:
            out.line(f"next: {shlex.join(captured['next'])}")
    return int(ExitCode.OK)


@click.command("check-script")
@click.argument("script", type=CheckedPath("file"))
@_script_options
@command
def check_script_cmd(out: Out, script: Path, **opts: Any) -> int:
    """Check a collection script against the rules of its mode (exit 4 when a rule fails, 3 when verl would
    refuse its overrides)."""

    detection, req, _ = _derive(script, opts)
    _refuse_blocked(script, req)
    req = checked_requirements(detection.script, req)
    checks = check_script(detection.script, req)
    _missing_dump_arg(detection.script, req, checks)
    ok = all(c.ok for c in checks)
    out.emit(
        {
            "ok": ok,
            "script": str(script),
            "mode": req.mode,
            "train_backend": req.train_backend,
            "rollout_backend": req.rollout_backend,
            "checks": [c.to_json() for c in checks],
        }
    )
    out.line(f"{script}: {req.mode} ({req.train_backend} / {req.rollout_backend})", bold=True)
    for c in checks:
        word = "WARN" if c.warning else ("PASS" if c.ok else "FAIL")
        out.line(
            f"  {word}  {c.name}" + (f": {c.detail}" if c.detail else ""),
            fg="yellow" if c.warning else (None if c.ok else "red"),
        )
    out.line("script OK" if ok else "script check FAILED", fg="green" if ok else "red", bold=True)
    return int(ExitCode.OK if ok else ExitCode.VERIFY_FAILED)


def _given_configs_exist(opts: dict[str, Any]) -> None:
    """Each msprobe config given must be there: the run's processes read it from the directory the script runs
    in (--cwd, else this one), where a relative path is resolved."""
    base = Path(opts["cwd"]) if opts.get("cwd") else Path.cwd()
    for side in ("actor", "generate", "training"):
        given = opts.get(f"{side}_config")
        if given and not (base / given).is_file():
            raise RefusedError(
                f"--{side}-config {given}: no such file" + (f" (in {base})" if not Path(given).is_absolute() else ""),
                hint=f"write it with rlprobe-patch config, or leave --{side}-config out: script then writes one beside "
                "the collection script",
            )


def _refuse_blocked(script: Path, req: Any) -> None:
    """A run no option can make collectable in this mode: refused (exit 3) before any rule is checked."""
    if req.blocked:
        raise RefusedError(
            f"{script}: no {req.mode} collection is possible for this run",
            details=[req.blocked],
            hint="run the rollout on a backend msprobe dumps (vllm, sglang), or collect with --mode training",
        )


def _missing_dump_arg(script: Any, req: Any, checks: list[Any]) -> None:

    if req.mode in ("inference", "consistency") and not req.capture and "generate" not in req.configs:
        if not (req.rollout_backend == "sglang" and any("ModelRunner" in n for n in req.notices)):
            where = framework_of(script).dump_config_arg
            checks.append(ScriptCheck("rollout dump config", False, f"no {where} argument in the script"))
    if req.mode == "training" and "training" not in req.configs:
        checks.append(
            ScriptCheck("precision_debugger.config_path", False, "not set (global_tool_config.precision_debugger)")
        )
