"""`rlprobe-patch report`: per-token train-vs-rollout differences and msprobe's layer compare, in one page.

The options become a `report.make.ReportRequest`; `make_report` makes and writes the report; this prints it."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import click

from rlprobe_patch.base.errors import ExitCode, require
from rlprobe_patch.cli.options import python_option
from rlprobe_patch.cli.output import Out, command
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
    from rlprobe_patch.report.confirm import ConsistencyOf
    from rlprobe_patch.report.make import ReportRequest, make_report

    request = ReportRequest(paths, output, top, limits, replay_script, data, baseline, floor_step, python)
    consistency: ConsistencyOf | None = None
    if replay_script is not None:  # the confirming runs: what a consistency script of it sets, asked of the workflow
        from rlprobe_patch.workflow.derive import consistency_settings

        consistency = consistency_settings
    progress = _Progress()
    try:
        report = make_report(request, consistency, progress, progress.detail)
    finally:
        progress.close()
    out.emit_encoded(report.encoded())  # the requests can be many: encoded once, on one line
    for text, style in report.lines():
        out.line(text, **style)
    return int(ExitCode.OK if report.ok else ExitCode.VERIFY_FAILED)
