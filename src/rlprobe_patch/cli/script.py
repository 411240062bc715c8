"""`rlprobe-patch script` and `check-script`: a collection script derived from a training script, and its check."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from rlprobe_patch.base.errors import ExitCode, UsageError
from rlprobe_patch.cli.options import cwd_option, python_option, read_options, reader_options, verl_root_option
from rlprobe_patch.cli.output import Out, command
from rlprobe_patch.cli.paths import CheckedPath
from rlprobe_patch.workflow.collection import Collection, derive_collection, write_collection
from rlprobe_patch.workflow.derive import CollectOptions, check_script, checked_requirements, derive, refuse_blocked
from rlprobe_patch.workflow.detect import COLLECTION_MODES

if TYPE_CHECKING:
    from rlprobe_patch.launch.script import ReaderOptions


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


def _options(opts: dict[str, Any]) -> tuple[ReaderOptions, CollectOptions]:
    """How SCRIPT is read and what is collected, from the options `_script_options` define (`--arg` and `--env`
    taken out of `opts`)."""
    reader = read_options(
        opts, verl_root=opts["verl_root"], extra=tuple(opts.get("sets", ())), cwd=opts["cwd"], python=opts["python"]
    )
    collect = CollectOptions(
        train_backend=opts["train_backend"],
        rollout_backend=opts["rollout_backend"],
        n_gpus=opts["n_gpus"],
        configs=_configs(opts),
        stages=tuple(s.strip() for s in opts["stages"].split(",") if s.strip()) if opts["stages"] else (),
        save_path=opts["save_path"],
        sglang_version=opts["sglang_version"],
        vllm_ascend_version=opts["vllm_ascend_version"],
        vllm_version=opts["vllm_version"],
    )
    return reader, collect


def _configs(opts: dict[str, Any]) -> dict[str, str]:
    """The msprobe configs given, by side."""
    return {side: opts[f"{side}_config"] for side in ("actor", "generate", "training") if opts.get(f"{side}_config")}


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

    carried = _reader_flags(opts)  # before _options takes --arg / --env out of opts
    reader, collect = _options(dict(opts))
    collection = derive_collection(original, opts["mode"], reader, collect, opts["hint"], output, _invocation())
    if not dry_run:
        write_collection(collection, force, opts["python"])
    # check-script reads the derived script as this command read the original: same tree, environment, arguments
    next_command = ["rlprobe-patch", "check-script", str(collection.output), "--mode", collection.req.mode, *carried]
    out.emit(_document(collection, dry_run, next_command, list(opts.get("sets", ()))))
    _print_collection(out, collection, dry_run, next_command)
    return int(ExitCode.OK)


def _capture_next(collection: Collection, next_command: list[str]) -> list[str]:
    assert collection.capture is not None
    return [*next_command[:2], str(collection.capture.path), *next_command[3:]]


def _document(collection: Collection, dry_run: bool, next_command: list[str], sets: list[str]) -> dict[str, Any]:
    """`script --json`: the collection script, its capture run, the configs written, what to run next."""
    req, capture = collection.req, collection.capture
    captured = None
    if capture is not None:
        captured = {
            "output": None if dry_run else str(capture.path),
            "changes": [c.to_json() for c in capture.changes],
            "env": capture.req.env,
            "notices": capture.req.notices,
            "text": capture.text if dry_run else None,
            "next": None if dry_run else _capture_next(collection, next_command),
        }
    return {
        "ok": True,
        "original": str(collection.original),
        "output": None if dry_run else str(collection.output),
        "mode": req.mode,
        "train_backend": req.train_backend,
        "rollout_backend": req.rollout_backend,
        "changes": [c.to_json() for c in collection.changes],
        "set": sets,
        "env": req.env,
        "pinned_env": req.pinned,
        "pinned_probes": {name: probe.value for name, probe in req.probes.items()},
        "notices": req.notices,
        "text": collection.text if dry_run else None,
        "next": None if dry_run else next_command,
        "capture": captured,
        "configs": collection.configs,
    }


def _print_collection(out: Out, collection: Collection, dry_run: bool, next_command: list[str]) -> None:
    req, capture = collection.req, collection.capture
    for c in collection.changes:
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
            f"{collection.detection.script.reading.python}: {how})",
            fg="green",
        )
    for notice in req.notices:
        out.line(f"notice: {notice}", fg="yellow")
    if dry_run:
        out.line(collection.text)
        if capture is not None:
            out.line(capture.text)
        return
    for side, written in collection.configs.items():
        check = written["msprobe_check"]
        how = (
            f"loaded by msprobe {check.get('msprobe')}" if check else f"not checked by msprobe: {written['unchecked']}"
        )
        out.line(
            f"wrote {written['output']} (the {side} side's msprobe config, no --{side}-config given; {how})",
            fg="green" if check else "yellow",
        )
    out.line(f"wrote {collection.output} ({req.mode}); {collection.original} is unchanged", fg="green", bold=True)
    if capture is not None:
        out.line(
            f"wrote {capture.path} (its log-prob capture run, for report: the same launch without the dump, "
            "MISMATCH_ON=1; the dump run cuts its batches to their prompts and cannot capture)",
            fg="green",
            bold=True,
        )
    out.line(f"next: {shlex.join(next_command)}")
    if capture is not None:
        out.line(f"next: {shlex.join(_capture_next(collection, next_command))}")


@click.command("check-script")
@click.argument("script", type=CheckedPath("file"))
@_script_options
@command
def check_script_cmd(out: Out, script: Path, **opts: Any) -> int:
    """Check a collection script against the rules of its mode (exit 4 when a rule fails, 3 when verl would
    refuse its overrides)."""

    reader, collect = _options(opts)
    detection, req, _ = derive(script, opts["mode"], reader, collect, opts["hint"])
    refuse_blocked(script, req)
    req = checked_requirements(detection.script, req)
    checks = check_script(detection.script, req)
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
