"""The token plots' axes (report/svgplot.py): tick labels a person can read, each saying its own value."""

from __future__ import annotations

import math
import re

import pytest

from rlprobe_patch.report import svgplot


@pytest.mark.parametrize(
    "values",
    [[0.0, 0.00027], [0.013, 0.066], [1.0, 3.0], [0.0, 1234567.0], [-0.5, 0.25], [2.5e-9, 7.1e-9], [5.0, 5.0]],
)
def test_linear_ticks_are_distinct_and_cover_the_values(values: list[float]) -> None:
    scale = svgplot.linear(values)
    ticks = scale.ticks()
    labels = [label for _, label in ticks]
    assert 3 <= len(ticks) <= 12 and len(set(labels)) == len(labels), labels
    assert scale.low <= min(values) and scale.high >= max(values)
    for value, label in ticks:  # each label reads as its tick's value, to the label's precision
        assert math.isclose(float(label), value, rel_tol=0.05, abs_tol=1e-12 + abs(ticks[1][0] - ticks[0][0]) / 100)


@pytest.mark.parametrize("values", [[1, 9], [1, 12], [3e-7, 0.19], [1e-300, 1e-3], [0.002, 0.004]])
def test_log_ticks_are_several_and_distinct(values: list[float]) -> None:
    """Issue 42, item 8: a log axis had one tick label. Within two decades the ticks are 1, 2, 5 of each; over
    many, at most about eight decades are labelled."""
    scale = svgplot.logarithmic(values)
    labels = [label for _, label in scale.ticks()]
    assert 3 <= len(labels) <= 10 and len(set(labels)) == len(labels), labels
    assert all(float(label) > 0 for label in labels)


def test_a_chart_tags_its_axes_and_legend_and_keeps_text_as_text() -> None:
    x = svgplot.linear([0, 10])
    panels = [
        svgplot.Panel(svgplot.linear([0, 1]), [svgplot.Series("line", [0.1, 0.5], [0, 10], label="a & b")], "y1"),
        svgplot.Panel(svgplot.logarithmic([1, 100]), [svgplot.Series("stairs", [1, 50], edges=[0, 5, 10])], "y2"),
    ]
    svg = svgplot.chart("demo", "a title", x, panels, "position", legend_title="series")
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert re.findall(r'id="(demo-[a-z]+\d?)"', svg) == [
        "demo-svg", "demo-axes0", "demo-yticks0", "demo-xticks0", "demo-axes1", "demo-yticks1", "demo-xticks1",
        "demo-legend",
    ]  # fmt: skip
    assert ">a &amp; b</text>" in svg and ">a title</text>" in svg and ">position</text>" in svg
