"""`rlprobe-patch doctor`: can the training interpreter run msprobe, and what else is there."""

from __future__ import annotations

import click

from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.cli.options import python_option
from rlprobe_patch.cli.output import Out, command


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
        for advice in report.advice:
            out.line(f"note: {advice}", fg="yellow")
        if not install and not report.advice:
            # msprobe imports the torch of the environment it is installed in: the training one
            out.line(f"fix: rlprobe-patch doctor --install --python {python or '<the training python>'}")
    for name, p in report.packages.items():
        if name == "msprobe":
            continue
        out.line(f"  {name:<14} {p.version or '?'}" + (f"  ({p.location})" if p.found else "  not found"))
    if report.verl.get("found"):
        out.line(f"verl {report.verl['version']} at {report.verl['root']}")
        for patch in report.patches:
            out.line(f"  {patch['id']:<26} {patch['state']}")
    if not report.rollout:
        out.line("rollout engine: none found (vLLM, vLLM-Ascend, SGLang)", fg="yellow")
    for name, engine in report.rollout.items():
        out.line(f"rollout engine (rollout.name={name}): {engine['says']}", fg="green" if engine["dumps"] else "yellow")
    return int(ExitCode.OK if report.ok else ExitCode.VERIFY_FAILED)
