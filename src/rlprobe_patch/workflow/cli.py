"""The workflow commands: detect, doctor, config, script, check-script, check-dump.

`cli.py`'s registry names them; they use `cli_base.command` (`--json`, PatchError -> message
and exit code) like the patch commands.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from rlprobe_patch.cli_base import Out, command
from rlprobe_patch.errors import ExitCode, PatchError, RefusedError
from rlprobe_patch.workflow.config import LEVELS, TASKS
from rlprobe_patch.workflow.detect import MODES, STAGES
from rlprobe_patch.workflow.options import read_options, reader_options

python_option = click.option(
    "--python", "python", metavar="PATH", help="The training environment's interpreter (default: this one)."
)


class WorkflowUsageError(PatchError):
    """A bad combination of options, found inside the command (exit 2, like click's own)."""

    exit_code = ExitCode.USAGE


# -- how the script is read (detect, script, check-script) ---------------------------------------
def verl_tree_of(verl_root: Path | None, python: str | None) -> tuple[Path | None, str | None]:
    """(root, version) of the verl tree the values are composed with, when one is named."""
    if verl_root is None and python is None:
        return None, None
    from rlprobe_patch.trees import find_verl_tree

    tree = find_verl_tree(verl_root, python)
    return tree.root, str(tree.version)


def reading_json(s: Any) -> dict[str, Any]:
    launch = s.launch
    composed = s.composed
    return {
        "framework": s.framework,
        "launch": None
        if launch is None
        else {
            "entry": launch.entry,
            "launcher": list(launch.launcher),
            "source": launch.source,
            "conditions": list(launch.run.conditions),
            "argv": [{"text": f.text, "source": f.source, "exact": f.exact} for f in launch.args],
        },
        "facts": {k: {"value": v.value, "source": v.source} for k, v in s.facts.items()},
        "assumed": bool(composed and composed.assumed),
        "compose_errors": list(composed.errors) if composed else [],
        "compose_notes": list(composed.notes) if composed else [],
        "unresolved": s.unresolved,
    }


# -- detect ---------------------------------------------------------------------------------------
@click.command("detect")
@click.argument("script", type=click.Path(path_type=Path))
@click.option("--hint", default="", help="What the user asked for (e.g. 'consistency', '推理采集').")
@python_option
@click.option(
    "--verl-root", type=click.Path(path_type=Path), help="Compose with this verl tree's config (default: --python's)."
)
@click.option("--no-trees", is_flag=True, help="Do not look for verl / SGLang / vLLM-Ascend in the interpreter.")
@reader_options
@command
def detect_cmd(
    out: Out, script: Path, hint: str, python: str | None, verl_root: Path | None, no_trees: bool, **opts: Any
) -> int:
    """Collection mode, training and rollout backends of SCRIPT, with the source of each value."""
    from rlprobe_patch.workflow.detect import detect_script, found_trees

    reader = read_options(opts)
    root, release = verl_tree_of(verl_root, python)
    d = detect_script(script, hint, verl_root=root, release=release, **reader)
    trees = None if no_trees or verl_root is not None else found_trees(python)
    s = d.script
    out.emit(
        {
            "ok": True,
            "script": str(script),
            "mode": d.mode,
            "scores": d.scores,
            "train_backend": d.train_backend,
            "rollout_backend": d.rollout_backend,
            "verl": {"root": str(root), "version": release} if root is not None else None,
            **reading_json(s),
            "signals": [x.to_json() for x in d.signals],
            "notices": d.notices,
            "sglang_pairing": d.pairing,
            "overrides": [o.to_json() for o in s.overrides],
            "env": {k: v.to_json() for k, v in s.env.items()},
            "yaml_files": [
                {"path": str(y.path), "reason": y.reason, "loaded": y.loaded, "error": y.error} for y in s.yaml_files
            ],
            "trees": trees,
        }
    )
    out.line(f"{script}", bold=True)
    if s.launch is not None:
        out.line(f"launch: {' '.join(s.launch.launcher)} {s.launch.entry}  ({s.launch.source})")
    if root is not None:
        out.line(f"values composed by Hydra with verl {release} at {root}")
    elif s.composed is not None and s.composed.assumed:
        out.line("no verl tree: defaults assumed from the catalogue (pass --verl-root or --python)", fg="yellow")
    for decision, value in (
        ("mode", d.mode),
        ("train_backend", d.train_backend),
        ("rollout_backend", d.rollout_backend),
    ):
        out.line(f"{decision.replace('_', ' ')}: {value}", fg=None if value != "unknown" else "yellow", bold=True)
        for sig in d.signals_for(decision):
            points = f"+{sig.points:<2} " if decision == "mode" else ""
            out.line(f"    {points}{sig.value:<12} {sig.evidence}  ({sig.where})")
    out.line("scores: " + ", ".join(f"{m} {n}" for m, n in d.scores.items()))
    names: tuple[str, ...] = (
        "use_legacy_worker_impl",
        "use_v1",
        "actor_tp",
        "actor_pp",
        "rollout_tp",
        "n_gpus_per_node",
        "nnodes",
    )
    if s.framework == "slime":
        names = tuple(fact for fact, *_ in slime_facts())
    for name in names:
        fact = s.facts.get(name)
        if fact is not None:
            out.line(f"  {name:<24} {fact.value}  ({fact.source})")
    if d.pairing:
        out.line("SGLang rollout, what check-dump needs to pair prefills by rid:")
        for row in d.pairing:
            found = "unset" if row["found"] is None else f"{row['found']} ({row['source']})"
            mark = "ok " if row["ok"] else "SET"
            out.line(f"  {mark} {row['key']}={row['wanted']}  now: {found}", fg=None if row["ok"] else "yellow")
            out.line(f"        {row['why']}")
    if d.mode == "unknown":
        out.line("mode unknown: say which with --hint training|inference|consistency", fg="yellow")
    for notice in d.notices:
        out.line(f"notice: {notice}", fg="yellow")
    for error in s.composed.errors if s.composed else []:
        out.line(f"Hydra: {error}", fg="red")
    for item in s.unresolved:
        out.line(f"unresolved: {item}", fg="yellow")
    for y in s.yaml_files:
        out.line(f"yaml: {y.path} ({y.reason})" + ("" if y.loaded else f": not loaded, {y.error}"))
    if trees:
        _print_trees(out, trees)
    return int(ExitCode.OK)


def slime_facts() -> tuple[tuple[str, str, Any, str], ...]:
    from rlprobe_patch.workflow.slime_script import FACT_FLAGS

    return FACT_FLAGS


def _print_trees(out: Out, trees: dict[str, Any]) -> None:
    if "error" in trees:
        out.line(f"trees: {trees['error']}", fg="yellow")
        return
    out.line(f"interpreter: {trees['python']['python']} (Python {trees['python']['python_version']})")
    verl = trees["verl"]
    out.line(f"  verl         {verl['version']} at {verl['root']}" if verl["found"] else "  verl         not found")
    for name in ("sglang", "vllm", "vllm_ascend", "msprobe", "torch"):
        p = trees[name]
        out.line(f"  {name:<12} {p['version'] or '?'} at {p['location']}" if p["found"] else f"  {name:<12} not found")


# -- doctor ---------------------------------------------------------------------------------------
@click.command("doctor")
@python_option
@click.option("--install", is_flag=True, help="pip install mindstudio-probe into that interpreter if missing.")
@click.option("--requirement", default="mindstudio-probe", show_default=True, help="What --install installs.")
@click.option("--pip-arg", "pip_args", multiple=True, metavar="ARG", help="Extra pip argument (repeatable).")
@command
def doctor_cmd(out: Out, python: str | None, install: bool, requirement: str, pip_args: tuple[str, ...]) -> int:
    """Is msprobe importable where training runs? Also torch, verl, SGLang, vLLM-Ascend and patch states."""
    from rlprobe_patch.workflow.doctor import run_doctor

    report = run_doctor(python, install=install, requirement=requirement, pip_args=pip_args, progress=out.progress)
    out.emit(report.to_json())
    out.line(f"interpreter: {report.python['python']} (Python {report.python['python_version']})", bold=True)
    if report.install is not None:
        word = "ok" if report.install["ok"] else f"FAILED (exit {report.install['exit_code']})"
        out.line(f"pip install {requirement}: {word}", fg="green" if report.install["ok"] else "red")
        if not report.install["ok"]:
            for line in report.install["output_tail"]:
                out.line(f"    {line}")
    if report.ok:
        out.line(
            f"msprobe {report.msprobe.get('version')}: from msprobe.pytorch import PrecisionDebugger OK", fg="green"
        )
    else:
        out.line(f"msprobe: NOT importable: {report.msprobe.get('error')}", fg="red", bold=True)
        if not install:
            out.line("fix: rlprobe-patch doctor --install" + (f" --python {python}" if python else ""))
    for name, p in report.packages.items():
        if name == "msprobe":
            continue
        out.line(f"  {name:<14} {p.version or '?'}" + (f"  ({p.location})" if p.found else "  not found"))
    if report.verl.get("found"):
        out.line(f"verl {report.verl['version']} at {report.verl['root']}")
        for patch in report.patches:
            out.line(f"  {patch['id']:<26} {patch['state']}")
    return int(ExitCode.OK if report.ok else ExitCode.VERIFY_FAILED)


# -- config ---------------------------------------------------------------------------------------
def _int_list(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.replace("[", "").replace("]", "").split(",") if x.strip()]
    except ValueError:
        raise WorkflowUsageError(f"{text!r}: expected comma-separated integers") from None


@click.command("config")
@click.option("--mode", type=click.Choice(MODES), required=True)
@click.option("--side", type=click.Choice(["actor", "generate", "training"]), help="Default: the mode's first side.")
@click.option("--dump-path", metavar="DIR", help="Required for inference/consistency; forbidden for training.")
@click.option("--level", type=click.Choice(LEVELS), default="mix", show_default=True)
@click.option("--task", type=click.Choice(TASKS), default="statistics", show_default=True)
@click.option("--step", "steps", metavar="N[,N]", help="msprobe steps (default: [0] generate, [] otherwise).")
@click.option("--rank", "ranks", metavar="N[,N]", help="msprobe ranks (default: all).")
@click.option(
    "--rollout-backend",
    type=click.Choice(["vllm", "sglang"]),
    help="The rollout engine; sglang: the consistency generate side dumps every forward pass (step []) "
    "and the answer lists the server settings rid pairing needs.",
)
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="The config.json to write.")
@python_option
@click.option("--no-check", is_flag=True, help="Do not load it with msprobe (when msprobe is not installed here).")
@command
def config_cmd(
    out: Out,
    mode: str,
    side: str | None,
    dump_path: str | None,
    level: str,
    task: str,
    steps: str | None,
    ranks: str | None,
    rollout_backend: str | None,
    output: Path,
    python: str | None,
    no_check: bool,
) -> int:
    """Write an msprobe config.json for MODE and SIDE, checked by msprobe's own config loading."""
    from rlprobe_patch.workflow.config import SIDES, build_config, sglang_consistency_generate, write_config
    from rlprobe_patch.workflow.sglang_pairing import SGLANG_GENERATE_STEPS_WHY, SGLANG_PAIRING

    side = side or SIDES[mode][0]
    data = build_config(
        mode,
        side,
        dump_path,
        level=level,
        task=task,
        steps=_int_list(steps),
        ranks=_int_list(ranks),
        rollout_backend=rollout_backend,
    )
    checked = write_config(data, output, python, check=not no_check)
    needs: list[dict[str, Any]] = []
    if sglang_consistency_generate(mode, side, rollout_backend):
        needs = [{"key": s.key, "value": s.value, "why": s.why} for s in SGLANG_PAIRING]
        needs.append({"key": "step", "value": data["step"], "why": SGLANG_GENERATE_STEPS_WHY})
    out.emit(
        {
            "ok": True,
            "output": str(output),
            "mode": mode,
            "side": side,
            "rollout_backend": rollout_backend,
            "config": data,
            "msprobe_check": checked,
            "pairing_needs": needs,
        }
    )
    out.line(f"wrote {output} ({mode}, {side} side, level {level})", fg="green")
    if needs:
        out.line(f"step {data['step']}: {needs[-1]['why']}")
        out.line(
            "the SGLang server also needs, for check-dump to pair its prefills by rid (script --mode consistency):"
        )
        for need in needs[:-1]:
            out.line(f"    {need['key']}={need['value']}: {need['why']}")
    if checked:
        out.line(
            f"msprobe {checked.get('msprobe')} loads it: task {checked['task']}, level {checked['level']}, "
            f"step {checked['step']}, rank {checked['rank']}"
        )
    else:
        out.line("not checked with msprobe (--no-check)", fg="yellow")
    return int(ExitCode.OK)


# -- script / check-script ------------------------------------------------------------------------
def _script_options(fn: Any) -> Any:
    options = [
        click.option("--mode", type=click.Choice(MODES), help="Default: the mode detect finds."),
        click.option("--train-backend", type=click.Choice(["fsdp", "fsdp2", "megatron"]), help="Default: detected."),
        click.option("--rollout-backend", type=click.Choice(["vllm", "sglang"]), help="Default: detected."),
        click.option("--n-gpus", type=click.IntRange(min=1), help="Training GPUs in all (default: from the script)."),
        click.option(
            "--actor-config", metavar="PATH", help="msprobe config of the engine hook (MSPROBE_ACTOR_CONFIG)."
        ),
        click.option("--generate-config", metavar="PATH", help="msprobe config of the rollout side."),
        click.option("--training-config", metavar="PATH", help="msprobe config of verl's precision_debugger."),
        click.option("--stages", help=f"Training-mode stages (default: the script's, else {','.join(STAGES)})."),
        click.option("--save-path", metavar="DIR", help="Training mode: global_profiler.save_path."),
        click.option("--sglang-version", metavar="V", help="Default: the one --python imports."),
        click.option("--vllm-ascend-version", metavar="V", help="Default: the one --python imports."),
        click.option("--verl-root", type=click.Path(path_type=Path), help="The verl tree (default: --python's)."),
        python_option,
        click.option("--hint", default="", help="As for detect."),
        reader_options,
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _requirements(script: Path, opts: dict[str, Any]) -> tuple[Any, Any, Path | None]:
    from rlprobe_patch.errors import PatchError
    from rlprobe_patch.workflow.envprobe import packages
    from rlprobe_patch.workflow.script import load_detection, requirements

    versions: dict[str, str | None] = {}
    verl_root, versions["verl"] = verl_tree_of(opts["verl_root"], opts["python"])
    reader = read_options(opts)
    detection = load_detection(
        script, opts["hint"], verl_root=verl_root, release=versions["verl"], extra=list(opts.get("sets", ())), **reader
    )
    composed = detection.script.composed
    if composed is not None and composed.errors:
        raise RefusedError(
            f"{script}: verl would refuse this launch (Hydra cannot compose its overrides)",
            details=composed.errors,
            hint="fix the override named; verl stops on it at start-up",
        )
    mode = opts["mode"] or detection.mode
    if mode == "unknown":
        raise RefusedError(
            f"{script}: the collection mode is unknown", hint="pass --mode training|inference|consistency"
        )
    if opts["python"] is not None:
        try:
            found, _ = packages(opts["python"])
            versions["sglang"] = found["sglang"].version
            versions["vllm_ascend"] = found["vllm_ascend"].version
        except PatchError:
            pass
    if opts["sglang_version"]:
        versions["sglang"] = opts["sglang_version"]
    if opts["vllm_ascend_version"]:
        versions["vllm_ascend"] = opts["vllm_ascend_version"]
    # the paths given, else the ones the script already uses (so they are checked, not added)
    from rlprobe_patch.workflow.script import script_config_paths

    configs = script_config_paths(detection.script, mode)
    configs.update(
        {side: opts[f"{side}_config"] for side in ("actor", "generate", "training") if opts.get(f"{side}_config")}
    )
    if opts["stages"]:
        stages = tuple(s.strip() for s in opts["stages"].split(",") if s.strip())
    else:
        in_script = detection.script.get("precision_debugger.stages")
        stages = tuple(in_script.value) if in_script is not None and isinstance(in_script.value, list) else STAGES
    req = requirements(
        detection,
        mode,
        train_backend=opts["train_backend"],
        rollout_backend=opts["rollout_backend"],
        n_gpus=opts["n_gpus"],
        configs=configs,
        versions=versions,
        stages=stages,
        save_path=opts["save_path"],
    )
    return detection, req, verl_root


_NEEDED_CONFIGS = {"training": ("training",), "inference": ("generate",), "consistency": ("actor", "generate")}


@click.command("script")
@click.argument("original", type=click.Path(path_type=Path))
@_script_options
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Default: run_<mode>_dump_<date>.sh beside it.")
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
    from rlprobe_patch.workflow.script import default_output, render_script, write_script

    for item in opts.get("sets", ()):
        if "=" not in item or item.startswith("-"):
            raise WorkflowUsageError(f"--set {item!r}: expected a Hydra override KEY=VALUE")

    detection, req, verl_root = _requirements(original, opts)
    missing = [side for side in _NEEDED_CONFIGS[req.mode] if side not in req.configs]
    if missing:
        flags = " ".join(f"--{side}-config PATH" for side in missing)
        raise WorkflowUsageError(f"--mode {req.mode} needs {flags}", hint="write them with rlprobe-patch config")
    if req.refusals:
        fixes = " ".join(dict.fromkeys(f for f in req.fixes if f.startswith("--set")))
        others = [f for f in req.fixes if not f.startswith("--set")]
        hint = "nothing was written"
        if fixes:
            hint += f"; to collect with these values, add: {fixes}" + (f" (or {' / '.join(others)})" if others else "")
        raise RefusedError(f"{original}: cannot derive a {req.mode} collection script", details=req.refusals, hint=hint)
    text, changes = render_script(detection.script, req, original.name, composed=verl_root is not None)
    output = output or default_output(original, req.mode)
    if not dry_run:
        write_script(original, output, text, force)
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
            "notices": req.notices,
            "text": text if dry_run else None,
        }
    )
    for c in changes:
        where = f" (was {c.old} at {c.source})" if c.action in ("set", "removed") else ""
        colour = {"skipped": "yellow", "kept": None}.get(c.action, "green")
        out.line(f"  {c.action:<9} {c.key}={c.value}{where}", fg=colour)
    for name, value in req.env.items():
        out.line(f"  export    {name}={value}", fg="green")
    for notice in req.notices:
        out.line(f"notice: {notice}", fg="yellow")
    if dry_run:
        out.line(text)
    else:
        out.line(f"wrote {output} ({req.mode}); {original} is unchanged", fg="green", bold=True)
        out.line(f"next: rlprobe-patch check-script {output} --mode {req.mode}")
    return int(ExitCode.OK)


@click.command("check-script")
@click.argument("script", type=click.Path(path_type=Path))
@_script_options
@command
def check_script_cmd(out: Out, script: Path, **opts: Any) -> int:
    """Check a collection script against the rules of its mode (exit 4 when a rule fails, 3 when verl would
    refuse its overrides)."""
    from rlprobe_patch.workflow.script import check_script

    detection, req, _ = _requirements(script, opts)
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


def _missing_dump_arg(script: Any, req: Any, checks: list[Any]) -> None:
    from rlprobe_patch.workflow.script import ScriptCheck

    if req.mode in ("inference", "consistency") and "generate" not in req.configs:
        if not (req.rollout_backend == "sglang" and any("ModelRunner" in n for n in req.notices)):
            where = "--sglang-msprobe-dump-config" if script.framework == "slime" else "engine_kwargs dump config"
            checks.append(ScriptCheck("rollout dump config", False, f"no {where} argument in the script"))
    if req.mode == "training" and "training" not in req.configs:
        checks.append(
            ScriptCheck("precision_debugger.config_path", False, "not set (global_tool_config.precision_debugger)")
        )


# -- check-dump -----------------------------------------------------------------------------------
@click.command("check-dump")
@click.option("--actor", type=click.Path(path_type=Path), required=True, help="dump_path of the actor config.")
@click.option("--generate", type=click.Path(path_type=Path), help="dump_path of the generate config.")
@click.option(
    "--slime-debug",
    "slime_debug",
    multiple=True,
    type=click.Path(path_type=Path),
    help="slime's --save-debug-rollout-data / --save-debug-train-data files (or a folder of them); repeatable. "
    "Read with torch in --python.",
)
@click.option("--compare", is_flag=True, help="Run msprobe's compare on each pair (in --python).")
@click.option("--compare-output", type=click.Path(path_type=Path), default=Path("rlprobe_compare"), show_default=True)
@python_option
@command
def check_dump_cmd(
    out: Out,
    actor: Path,
    generate: Path | None,
    slime_debug: tuple[Path, ...],
    compare: bool,
    compare_output: Path,
    python: str | None,
) -> int:
    """Check the dump layout and pair generate and actor dumps through the request ids (exit 4 on problems)."""
    from rlprobe_patch.workflow.check_dump import check_dumps, compare_pairs

    report = check_dumps(actor, generate)
    if compare and not generate:
        raise WorkflowUsageError("--compare needs --generate")
    compared: list[dict[str, Any]] = []
    if compare and report.pairs:
        out.progress(f"msprobe compare on {len(report.pairs)} pair(s)")
        compared = compare_pairs(report, compare_output, python)
        for result in compared:
            if not result["ok"]:
                report.problems.append(
                    f"compare failed for {result['output']}: {result.get('error', 'no result file')}"
                )
    slime = None
    if slime_debug:
        from rlprobe_patch.workflow.slime_dumps import check_slime_debug, debug_files

        slime = check_slime_debug(report.actor_log, debug_files(list(slime_debug)), python)
        report.problems += slime.problems
        report.notes += slime.notes
    data = report.to_json()
    if slime is not None:
        data["slime_debug"] = {"files": slime.files, "rollouts": slime.rollouts}
    out.emit(data)
    a = data["actor"]
    out.line(
        f"actor: {a['dumps']} dump(s), steps {a['steps']}, ranks {a['ranks']}, {a['log_lines']} log line(s)", bold=True
    )
    if data["generate"]:
        g = data["generate"]
        out.line(
            f"generate: {g['dumps']} dump(s), steps {g['steps']}, ranks {g['ranks']}, "
            f"{g['dispatch_lines']} dispatch line(s)",
            bold=True,
        )
    for pair in report.pairs:
        # the actor's pipeline stage and model chunk, when its hook names them (Megatron PP / VPP)
        stage = ", ".join(f"{key} {pair[key]}" for key in ("pp_rank", "vp_stage") if pair.get(key) is not None)
        out.line(
            f"  {pair['request_id']}: generate {pair['generate']['dump']}  <->  actor {pair['actor']['dump']}"
            + (f" [{stage}]" if stage else ""),
            fg="green",
        )
        if "compare" in pair:
            result = pair["compare"]
            out.line(f"      compare: {result['output']} {result.get('files', '')}")
            if result.get("agree") is not None:
                verdict = "agree" if result["agree"] else "DISAGREE"
                where = ": " + ", ".join(result["mismatched"]) if result["mismatched"] else ""
                out.line(
                    f"      msprobe: {verdict} ({result['matched']} of {result['rows']} rows matched; "
                    f"Result {result['results']}, accuracy reached {result.get('accuracy_reached')}){where}",
                    fg="green" if result["agree"] else "red",
                )
    for item in report.unpaired:
        out.line(f"  unpaired: {item['request_id'] or '-'} ({item['generate_log']}): {item['reason']}", fg="yellow")
    if slime is not None:
        _print_slime_debug(out, slime)
    for note in report.notes:
        out.line(f"note: {note}", fg="yellow")
    for problem in report.problems:
        out.line(f"FAIL: {problem}", fg="red")
    out.line("dumps OK" if report.ok else "dump check FAILED", fg="green" if report.ok else "red", bold=True)
    return int(ExitCode.OK if report.ok else ExitCode.VERIFY_FAILED)


def _print_slime_debug(out: Out, slime: Any) -> None:
    out.line(f"slime debug dumps: {len(slime.files)} file(s)", bold=True)
    for entry in slime.rollouts:
        name = f"eval rollout {entry['rollout_id']}" if entry["evaluation"] else f"rollout {entry['rollout_id']}"
        out.line(f"  {name}:")
        for dump in entry["rollout_dumps"]:
            ids = [ids[0] if ids else "-" for ids in dump["request_ids"].values()]
            out.line(f"    rollout data {dump['path']}: {dump['samples']} sample(s) {dump['sample_indices']} ids {ids}")
        for dump in entry["train_dumps"]:
            out.line(
                f"    train data (format {dump['format_version']}, rank {dump['rank']}) {dump['path']}: "
                f"samples {dump['sample_indices']}"
                + (f", {len(dump['dp_shards'])} dp shard(s)" if "dp_shards" in dump else "")
            )
        for step in entry.get("actor_steps", []):
            out.line(
                f"    actor {step['phase']} step {step['step']} rank {step['rank']}: samples {step['sample_indices']} "
                f"{step['request_ids']}  ({step['log']})",
                fg="green",
            )
