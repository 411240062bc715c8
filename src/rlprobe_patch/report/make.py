"""`rlprobe-patch report` as one call: `make_report(ReportRequest) -> Report`.

The inputs sorted and read, the noise floor chosen once, the launch script read once, the document built
(`build`), its inputs, notes and replay added, report.json and report.html written; the `Report` says what the
command prints (`lines`) and its exit (`ok`). The CLI parses the options into a `ReportRequest` and renders the
`Report`; nothing of the document is changed after `make_report` returns it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlprobe_patch.base.errors import require
from rlprobe_patch.report import encode, with_entry, write_outputs
from rlprobe_patch.report.build import (
    Inputs,
    build,
    classify,
    read_baseline,
    read_evidence,
    read_inputs,
    replay,
    run_settings,
)
from rlprobe_patch.report.confirm import ConsistencyOf, confirming_keys
from rlprobe_patch.report.floor import choose_floor
from rlprobe_patch.report.next_steps import next_steps
from rlprobe_patch.report.page import render_html
from rlprobe_patch.report.plots import plots
from rlprobe_patch.report.summary import diagnosis_lines, summary_lines

# a line the command prints, and its style (click.secho's keywords: fg, bold)
Line = tuple[str, dict[str, Any]]


@dataclass(frozen=True)
class ReportRequest:
    """What `report` is asked: the inputs as given (files or folders) and the options."""

    paths: tuple[Path, ...]
    output: Path
    top: int = 10
    limits: Mapping[str, float | None] = field(default_factory=dict)  # build.THRESHOLDS' options given
    replay_script: Path | None = None
    data: Path | None = None
    baseline: Path | None = None
    floor_step: int | None = None
    python: str | None = None


@dataclass(frozen=True)
class Report:
    """A report made and written: its document (report.json), where it was written, what it prints."""

    document: dict[str, Any]
    line: str  # the document on one line, `written` last: what `--json` prints after `ok`
    written: dict[str, str]
    top: int

    @property
    def crossed(self) -> list[dict[str, Any]]:
        """The thresholds crossed, and the verdict where it decides the exit and fails."""
        crossed = [c for c in self.document["thresholds"] if c["crossed"]]
        judged = self.document["verdict"]
        if judged["decides_exit"] and judged["state"] == "fail":
            crossed.append(judged)
        return crossed

    @property
    def ok(self) -> bool:
        return not self.crossed

    def encoded(self) -> str:
        """The `--json` document: `ok` first, then report.json's keys and `written`, on one line."""
        return '{"ok": ' + ("true" if self.ok else "false") + ", " + self.line[1:]

    def lines(self) -> list[Line]:
        """What the command prints: the figures, notes, replay, verdict, thresholds, diagnosis, next steps."""
        document = self.document
        lines: list[Line] = [(line, {}) for line in summary_lines(document, self.top)]
        lines += [(f"note: {note}", {"fg": "yellow"}) for note in document["notes"]]
        lines += _replay_lines(document.get("replay") or {})
        judged = document["verdict"]
        colour = {"ok": "green", "warn": "yellow", "fail": "red"}.get(judged["state"])
        lines.append((f"verdict: {judged['state'].upper()} (by {judged['source']})", {"fg": colour, "bold": True}))
        lines += [(f"  {reason}", {}) for reason in judged["reasons"]]
        if not judged["decides_exit"]:
            lines.append(("  (the threshold options given decide the exit code)", {}))
        for c in document["thresholds"]:
            state = "no value" if c["crossed"] is None else ("CROSSED" if c["crossed"] else "within")
            text = f"{c['option']} {c['limit']}: {c['metric']} = {c['value']} ({state})"
            lines.append((text, {"fg": "red" if c["crossed"] else "green"}))
        lines += [(line, {}) for line in diagnosis_lines(document)]
        for why, what in next_steps(document):
            lines.append((f"next: {why}", {}))
            lines += [(f"  {command_line.strip()}", {}) for command_line in what.splitlines()]
        lines.append((f"report: {self.written['html']}", {"bold": True}))
        return lines


def _replay_lines(replay_info: dict[str, Any]) -> list[Line]:
    lines: list[Line] = []
    if replay_info.get("command"):
        worst = f"replay: {len(replay_info['requests'])} worst request(s), prompts in {replay_info['prompts']}"
        lines.append((worst, {}))
        lines.append((f"  {replay_info['command']}", {}))
    if replay_info.get("why_not"):
        if replay_info["prompts"]:
            what = f"{len(replay_info['without_prompt'])} request(s) left out of replay_prompts.jsonl"
        else:
            what = "replay_prompts.jsonl not written"
        lines.append((f"replay: {what}: {replay_info['why_not']}", {"fg": "yellow"}))
    return lines


def _inputs_json(request: ReportRequest, inputs: Inputs) -> dict[str, Any]:
    return {
        "captures": [str(p) for p in inputs.captures],
        "slime": [str(p) for p in inputs.slime],
        "compare": [str(p) for p in inputs.compares],
        "records": [str(p) for p in inputs.records],
        "weights": [str(p) for p in inputs.weights],
        # as given, for the commands printed next: the same inputs, folder, floor and launch script
        "given": [str(p) for p in request.paths],
        "output": str(request.output),
        "baseline": str(request.baseline) if request.baseline is not None else None,
        "replay_script": str(request.replay_script) if request.replay_script is not None else None,
    }


def _say(_: str) -> None:
    pass


def make_report(
    request: ReportRequest,
    consistency: ConsistencyOf | None = None,
    progress: Callable[[str], None] = _say,
    detail: Callable[[str], None] = _say,
) -> Report:
    """The report of `request`, written to its output folder. `consistency` says what a consistency collection of
    the launch script sets (`workflow.derive.consistency_settings`: the confirming runs are printed only where
    they differ from it; without it, none are); `progress` is told each phase, `detail` each capture read."""
    inputs = classify(list(request.paths))
    if inputs.compares:
        require("matplotlib", "report (its layer plot)")  # the token plots are drawn without it
    progress(
        f"reading {len(inputs.captures)} capture(s), {len(inputs.slime)} slime dump(s), "
        f"{len(inputs.compares)} compare CSV(s)"
    )
    batches, pairs, notes = read_inputs(inputs, request.python, detail)
    evidence = read_evidence(inputs)
    floor = choose_floor(batches, read_baseline(request.baseline) if request.baseline else [], request.floor_step)
    settings = run_settings(request.replay_script, request.python)
    notes += [settings.note] if settings.note else []
    script = str(request.replay_script) if request.replay_script is not None else None
    plain = consistency(script, confirming_keys()) if consistency and script and batches else None
    tokens = sum(int(b.mask.sum()) for b in batches)
    progress(f"the figures and the diagnosis of {tokens} response token(s) in {len(batches)} step(s)")
    document = build(
        batches,
        pairs,
        dict(request.limits),
        floor,
        script,
        settings.sampling,
        evidence,
        settings.clip,
        consistency=plain,
        clip_source=settings.clip_source,
    )
    document["inputs"] = _inputs_json(request, inputs)
    document["notes"] = notes
    if document["tokens"]:
        document["replay"] = replay(batches, document, request.top, request.output, script, request.data)
    progress(f"the plots, report.html and report.json in {request.output}")
    text, line = encode(document)
    written = write_outputs(text, render_html(document, plots(document), request.top), request.output)
    return Report(document, with_entry(line, "written", written), written, request.top)
