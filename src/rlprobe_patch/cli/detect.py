"""`rlprobe-patch detect`: the collection mode and the backends of a training script, each with its source."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.cli.options import cwd_option, python_option, read_options, reader_options, verl_root_option
from rlprobe_patch.cli.output import Out, command
from rlprobe_patch.cli.paths import CheckedPath
from rlprobe_patch.workflow.derive import framework_of, verl_tree_of
from rlprobe_patch.workflow.detect import Detection, detect_script, found_trees, refusal_hint


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


@click.command("detect")
@click.argument("script", type=CheckedPath("file"))
@click.option("--hint", default="", help="What the user asked for (e.g. 'consistency', '推理采集').")
@python_option
@verl_root_option
@click.option("--no-trees", is_flag=True, help="Do not look for verl / SGLang / vLLM-Ascend in the interpreter.")
@reader_options
@cwd_option
@command
def detect_cmd(
    out: Out,
    script: Path,
    hint: str,
    python: str | None,
    verl_root: Path | None,
    no_trees: bool,
    cwd: Path | None,
    **opts: Any,
) -> int:
    """Collection mode, training and rollout backends of SCRIPT, with the source of each value (exit 3 when
    neither backend is known)."""

    root, release = verl_tree_of(verl_root, python)
    d = detect_script(script, hint, read_options(opts, verl_root=root, release=release, cwd=cwd, python=python))
    trees = None if no_trees or verl_root is not None else found_trees(python)
    s = d.script
    # nothing to collect from: neither backend is known (no verl launch read, or Hydra refused it)
    known = d.train_backend != "unknown" or d.rollout_backend != "unknown"
    hint = "" if known else refusal_hint(s)
    out.emit(_document(script, d, known, hint, root, release, trees))
    _print_detection(out, script, d, root, release)
    if trees:
        _print_trees(out, trees)
    if not known:
        out.line(
            f"refused: neither the training nor the rollout backend could be read from the script "
            f"(see the lines above; {hint})",
            fg="red",
            bold=True,
        )
        return int(ExitCode.REFUSED)
    return int(ExitCode.OK)


def _document(
    script: Path, d: Detection, known: bool, hint: str, root: Path | None, release: str | None, trees: Any
) -> dict[str, Any]:
    """`detect --json`: the mode and backends with their signals, the launch read, the trees found."""
    s = d.script
    return {
        "ok": known,
        **({"hint": hint} if hint else {}),
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


def _print_detection(out: Out, script: Path, d: Detection, root: Path | None, release: str | None) -> None:
    s = d.script
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
    for name in framework_of(s).facts_shown:
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
    if "vllm_engine" in trees:
        engine = trees["vllm_engine"]
        out.line(f"rollout.name=vllm runs: {engine['says']}", fg="green" if engine["dumps"] else "yellow")
