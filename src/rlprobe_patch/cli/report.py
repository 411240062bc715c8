"""`rlprobe-patch report`: per-token train-vs-rollout differences and msprobe's layer compare, in one page."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import click

from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.cli.options import python_option
from rlprobe_patch.cli.output import Out, command, require
from rlprobe_patch.cli.paths import CheckedPath


class _Progress:
    """What the report is doing, on stderr, once it has run `after` seconds (a report over a whole run: minutes of
    captures), and again every `every` seconds of one long phase; a report that ends sooner says nothing. A
    `detail` (the captures read so far) is said at most every 2 seconds. stdout stays the report's text or JSON."""

    def __init__(self, after: float = 3.0, every: float = 10.0) -> None:
        self.start = time.monotonic()
        self.phase = "starting"
        self.late = after <= 0  # said from the start
        self.said_at = 0.0
        self.lock = threading.Lock()
        self.done = threading.Event()
        threading.Thread(target=self._watch, args=(after, every), daemon=True).start()

    def __call__(self, phase: str) -> None:
        self.phase = phase
        if self.late:
            self._say()

    def detail(self, text: str) -> None:
        self.phase = text
        if self.late and time.monotonic() - self.said_at >= 2.0:
            self._say()

    def _watch(self, after: float, every: float) -> None:
        if not self.late:
            if self.done.wait(after):
                return
            self.late = True
            self._say()
        while not self.done.wait(every):
            if time.monotonic() - self.said_at >= every:
                self._say()

    def _say(self) -> None:
        with self.lock:
            self.said_at = time.monotonic()
            click.secho(f"... report: {self.phase} ({self.said_at - self.start:.0f} s so far)", err=True, dim=True)

    def close(self) -> None:
        self.done.set()


@click.command("report")
@click.argument("paths", nargs=-1, required=True, type=CheckedPath("file-or-dir"))
@click.option(
    "-o",
    "--output",
    type=CheckedPath("new-dir"),
    default=Path("rlprobe_report"),
    show_default=True,
    help="Folder for report.html, report.json and the replay prompts.",
)
@click.option(
    "--top", type=click.IntRange(min=1), default=10, show_default=True, help="Worst requests shown and replayed."
)
@click.option("--max-prob-diff", type=float, help="Exit 4 above this training/rollout_probs_diff_max.")
@click.option("--max-prob-diff-mean", type=float, help="Exit 4 above this training/rollout_probs_diff_mean.")
@click.option("--max-abs-kl", type=float, help="Exit 4 when |kl| (verl's rollout_corr/kl) is above it.")
@click.option("--max-k3-kl", type=float, help="Exit 4 above this k3_kl.")
@click.option("--min-pearson-corr", type=float, help="Exit 4 below this training/rollout_actor_probs_pearson_corr.")
@click.option("--max-diverging-pairs", type=click.IntRange(min=0), help="Exit 4 when more compare pairs diverge.")
@click.option(
    "--replay-script",
    type=CheckedPath("file"),
    metavar="SCRIPT",
    help="The run's launch script: its sampling settings, and the printed replay and confirming commands.",
)
@click.option(
    "--data",
    type=CheckedPath("file"),
    help="The run's dataset as JSON lines: replay rows are taken from it by the dataset index the capture carries.",
)
@click.option(
    "--baseline",
    type=CheckedPath("file-or-dir"),
    help="A capture (or folder of them) of the same computation twice (the same engine run twice on one batch): "
    "its spread is the noise floor the diagnosis judges against.",
)
@click.option(
    "--floor-step",
    type=int,
    metavar="STEP",
    help="A step of the inputs run with the same weights on both sides (the demo's step 1): its spread is the floor.",
)
@python_option
@command
def report_cmd(
    out: Out,
    paths: tuple[Path, ...],
    output: Path,
    top: int,
    replay_script: Path | None,
    data: Path | None,
    baseline: Path | None,
    floor_step: int | None,
    python: str | None,
    **limits: Any,
) -> int:
    """Report train-vs-rollout log-probs (captures, slime debug dumps) and compare CSVs (exit 4 over a threshold)."""
    require("numpy", "report")
    from rlprobe_patch.report import encode, with_entry, write_outputs
    from rlprobe_patch.report.build import (
        build,
        classify,
        read_baseline,
        read_evidence,
        read_inputs,
        replay,
        run_settings,
    )
    from rlprobe_patch.report.diagnosis import choose_floor
    from rlprobe_patch.report.next_steps import next_steps
    from rlprobe_patch.report.render import diagnosis_lines, plots, render_html, summary_lines

    progress = _Progress()
    try:
        inputs = classify(list(paths))
        if inputs.compares:
            require("matplotlib", "report (its layer plot)")  # the token plots are drawn without it
        progress(f"reading {len(inputs.captures)} capture(s), {len(inputs.slime)} slime dump(s), "
                 f"{len(inputs.compares)} compare CSV(s)")  # fmt: skip
        batches, pairs, notes = read_inputs(inputs, python, progress.detail)
        evidence = read_evidence(inputs)
        floor = choose_floor(batches, read_baseline(baseline) if baseline else [], floor_step)
        settings = run_settings(replay_script, python)
        notes += [settings.note] if settings.note else []
        script = str(replay_script) if replay_script is not None else None
        tokens = sum(int(b.mask.sum()) for b in batches)
        progress(f"the figures and the diagnosis of {tokens} response token(s) in {len(batches)} step(s)")
        report = build(batches, pairs, limits, floor, script, settings.sampling, evidence, settings.clip)
        if report.get("diagnosis") and report["diagnosis"].get("clip"):
            report["diagnosis"]["clip"]["source"] = settings.clip_source
        report["inputs"] = {
            "captures": [str(p) for p in inputs.captures],
            "slime": [str(p) for p in inputs.slime],
            "compare": [str(p) for p in inputs.compares],
            "records": [str(p) for p in inputs.records],
            "weights": [str(p) for p in inputs.weights],
            # as given, for the commands printed next: the same inputs, folder, floor and launch script
            "given": [str(p) for p in paths],
            "output": str(output),
            "baseline": str(baseline) if baseline is not None else None,
            "replay_script": script,
        }
        report["notes"] = notes
        if report["tokens"]:
            report["replay"] = replay(batches, report, top, output, script, data)
        progress(f"the plots, report.html and report.json in {output}")
        text, line = encode(report)
        written = write_outputs(text, render_html(report, plots(report), top), output)
    finally:
        progress.close()
    crossed = [c for c in report["thresholds"] if c["crossed"]]
    judged = report["verdict"]
    if judged["decides_exit"] and judged["state"] == "fail":
        crossed.append(judged)
    # the requests can be many: encoded once, on one line; `ok` first, as every command's JSON has it
    out.emit_encoded('{"ok": ' + ("false" if crossed else "true") + ", " + with_entry(line, "written", written)[1:])
    for line in summary_lines(report, top):
        out.line(line)
    for note in notes:
        out.line(f"note: {note}", fg="yellow")
    replay_info = report.get("replay") or {}
    if replay_info.get("command"):
        out.line(f"replay: {len(replay_info['requests'])} worst request(s), prompts in {replay_info['prompts']}")
        out.line(f"  {replay_info['command']}")
    if replay_info.get("why_not"):
        if replay_info["prompts"]:
            what = f"{len(replay_info['without_prompt'])} request(s) left out of replay_prompts.jsonl"
        else:
            what = "replay_prompts.jsonl not written"
        out.line(f"replay: {what}: {replay_info['why_not']}", fg="yellow")
    colour = {"ok": "green", "warn": "yellow", "fail": "red"}.get(judged["state"])
    out.line(f"verdict: {judged['state'].upper()} (by {judged['source']})", fg=colour, bold=True)
    for reason in judged["reasons"]:
        out.line(f"  {reason}")
    if not judged["decides_exit"]:
        out.line("  (the threshold options given decide the exit code)")
    for c in report["thresholds"]:
        state = "no value" if c["crossed"] is None else ("CROSSED" if c["crossed"] else "within")
        out.line(
            f"{c['option']} {c['limit']}: {c['metric']} = {c['value']} ({state})", fg="red" if c["crossed"] else "green"
        )
    for line in diagnosis_lines(report):
        out.line(line)
    for why, what in next_steps(report):
        out.line(f"next: {why}")
        for command_line in what.splitlines():
            out.line(f"  {command_line.strip()}")
    out.line(f"report: {written['html']}", bold=True)
    return int(ExitCode.VERIFY_FAILED if crossed else ExitCode.OK)
