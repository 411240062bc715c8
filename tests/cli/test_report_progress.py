"""`report` says on stderr what it is doing once it has run a few seconds (issue 45), and nothing before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from rlprobe_patch.cli import main
from rlprobe_patch.cli import report as report_cli

DEMO = Path(__file__).resolve().parents[1] / "data" / "demo-consistency-vllm"


@pytest.mark.parametrize("after", [0.0, 3.0])
def test_progress_on_stderr_past_a_few_seconds(after: float, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the demo's report takes well under a second: a threshold of 0 stands for a report over a whole run
    monkeypatch.setattr(report_cli._Progress.__init__, "__defaults__", (after, 10.0))
    result = CliRunner().invoke(main, ["report", str(DEMO / "capture"), "-o", str(tmp_path / "out"), "--json"])
    assert result.exit_code == 4, result.output
    assert json.loads(result.stdout)["tokens"]["tokens"] == 48  # stdout stays one JSON document
    said = [line for line in result.stderr.splitlines() if line.startswith("... report: ")]
    if after:
        assert said == []
    else:
        assert said and said[-1].startswith(f"... report: the plots, report.html and report.json in {tmp_path}"), said
        assert all(line.endswith(" s so far)") for line in said), said


def test_details_are_said_at_most_every_two_seconds(capsys: pytest.CaptureFixture[str]) -> None:
    """A run of a thousand captures says how far its reading got, not a line per file; a phase is always said."""
    progress = report_cli._Progress(after=0.0, every=100.0)
    try:
        progress.detail("reading captures: 1 of 1000")
        progress.detail("reading captures: 2 of 1000")  # within 2 s of the last line: not said
        progress("the figures")
    finally:
        progress.close()
    said = capsys.readouterr().err.splitlines()
    assert [line.split(" (")[0] for line in said] == [
        "... report: reading captures: 1 of 1000",
        "... report: the figures",
    ], said


def test_captures_read_two_at_a_time_in_their_order(tmp_path: Path) -> None:
    """Issue 45: the report reads two captures at a time; it takes them in their order, says each read in that
    order, and a damaged one among them is refused by its name, as read alone, the rest not waited for."""
    from report_numbers import write_captures

    from rlprobe_patch.base.errors import RefusedError
    from rlprobe_patch.report.build import classify, read_inputs
    from rlprobe_patch.report.capture_format import read_capture

    write_captures(tmp_path / "run")
    inputs = classify([tmp_path / "run"])
    said: list[str] = []
    batches = read_inputs(inputs, None, said.append)[0]
    assert [b.path for b in batches] == [str(p) for p in inputs.captures] and len(batches) == 3
    assert [b.request_ids for b in batches] == [read_capture(p).request_ids for p in inputs.captures]
    assert said == [f"reading captures: {n} of 3" for n in (1, 2, 3)]
    second = inputs.captures[1]
    second.write_bytes(second.read_bytes()[:1000])  # a run stopped while writing it
    said.clear()
    with pytest.raises(RefusedError) as refused:
        read_inputs(inputs, None, said.append)
    with pytest.raises(RefusedError) as alone:
        read_capture(second)
    assert refused.value.message == alone.value.message and str(second) in refused.value.message
    assert said == ["reading captures: 1 of 3"]
