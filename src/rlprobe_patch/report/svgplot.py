"""Small SVG charts for the report's token plots: a few dozen bars or points, drawn as text in milliseconds.

The token plots (the |dlogp| histogram, the difference by position and by probability) are drawn from the
report's aggregates: at most 50 bins, 50 position ranges, 9 decades. Importing matplotlib and laying out its
figures took about ten times as long as reading a million tokens' captures (issue 45), so these charts are
written here, on the lines matplotlib draws them: axes boxes with tick labels that say their values, one
colour per series, a legend beside the axes, text kept as text. The layer plot, whose x axis holds the
module names, is matplotlib's (`render._layers`).

A chart is a stack of `Panel`s on one x axis; `chart` returns the `<svg>`, each panel's background tagged
`<name>-axes<i>` and the legend `<name>-legend` (what tests/runtime/test_report_runtime.py reads in the
browser).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

FONT = 11.0  # px; a character of the tick labels is about 0.6 of it wide
_CHAR = 0.6 * FONT
_WIDTH = 720.0
_PANEL = 190.0


@dataclass
class Scale:
    """One axis: linear, logarithmic or categorical (`labels`), and its ticks."""

    low: float = 0.0
    high: float = 1.0
    log: bool = False
    labels: list[str] = field(default_factory=list)  # categorical: one slot per label

    def fraction(self, value: float) -> float:
        if self.labels:
            return (value + 0.5) / len(self.labels)
        if self.log:
            return (math.log10(value) - math.log10(self.low)) / (math.log10(self.high) - math.log10(self.low))
        return (value - self.low) / (self.high - self.low)

    def ticks(self) -> list[tuple[float, str]]:
        if self.labels:
            return [(float(i), label) for i, label in enumerate(self.labels)]
        if self.log:
            return _log_ticks(self.low, self.high)
        return _linear_ticks(self.low, self.high)


def linear(values: list[float], zero: bool = False) -> Scale:
    """A linear scale around `values` (from 0 with `zero`), widened to its outer ticks."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    low, high = (min(finite), max(finite)) if finite else (0.0, 1.0)
    if zero:
        low = min(low, 0.0)
    if high <= low:
        low, high = (low - 1.0, high + 1.0) if low == 0 else (low - abs(low) / 2, high + abs(high) / 2)
    step = _nice_step(low, high)
    return Scale(math.floor(low / step) * step, math.ceil(high / step) * step)


def logarithmic(values: list[float]) -> Scale:
    """A log scale over the positive `values`, widened to whole decades."""
    positive = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    low, high = (min(positive), max(positive)) if positive else (1.0, 10.0)
    low, high = 10.0 ** math.floor(math.log10(low)), 10.0 ** math.ceil(math.log10(high))
    if high <= low:
        high = low * 10.0
    return Scale(low, high, log=True)


def _nice_step(low: float, high: float, target: int = 5) -> float:
    raw = (high - low) / target
    power = 10.0 ** math.floor(math.log10(raw))
    return next(m * power for m in (1.0, 2.0, 2.5, 5.0, 10.0) if m * power >= raw)


def _linear_ticks(low: float, high: float) -> list[tuple[float, str]]:
    step = _nice_step(low, high)
    count = round((high - low) / step)
    values = [low + i * step for i in range(count + 1)]
    fixed = step >= 1e-3 and max(abs(low), abs(high)) < 1e6  # one notation on an axis
    return [(v, _number(v, step, fixed)) for v in values]


def _number(value: float, step: float, fixed: bool) -> str:
    if abs(value) < step / 1e6:
        return "0"
    if fixed:
        decimals = max(0, -math.floor(math.log10(step) + 1e-9))
        return f"{value:.{decimals + (1 if round(step / 10.0**-decimals, 6) % 1 else 0)}f}"
    return f"{value:.3g}"


def _log_ticks(low: float, high: float) -> list[tuple[float, str]]:
    first, last = round(math.log10(low)), round(math.log10(high))
    decades = last - first
    every = max(1, math.ceil(decades / 8))
    ticks = [10.0**k for k in range(first, last + 1, every)]
    if decades <= 2:  # within two decades the decades alone are two or three labels: 2 and 5 between them
        ticks = sorted({m * 10.0**k for k in range(first, last + 1) for m in (1, 2, 5) if low <= m * 10.0**k <= high})
    return [(t, _log_label(t)) for t in ticks]


def _log_label(value: float) -> str:
    exponent = math.floor(math.log10(value) + 1e-9)
    if -3 <= exponent <= 4:
        return f"{value:.{max(0, -exponent)}f}"
    mantissa = value / 10.0**exponent
    return f"{mantissa:.0f}e{exponent}" if round(mantissa) != 1 else f"1e{exponent}"


@dataclass
class Series:
    """What a panel draws: `kind` "line" (points joined, with markers), "bars" (one per category), "stairs"
    (a histogram over `edges`: filled, or its outline)."""

    kind: str
    ys: Sequence[float | None]
    xs: Sequence[float] = field(default_factory=list)
    edges: Sequence[float] = field(default_factory=list)
    colour: str = "#3b6ea8"
    label: str = ""
    fill: bool = True
    dash: str = ""
    width: float = 1.6


@dataclass
class Panel:
    y: Scale
    series: list[Series]
    ylabel: str = ""


def chart(
    name: str,
    title: str,
    x: Scale,
    panels: list[Panel],
    xlabel: str,
    legend_title: str = "",
    width: float = _WIDTH,
    panel_height: float = _PANEL,
) -> str:
    """The panels stacked on the x axis `x`, as an inline `<svg>` (no XML prologue)."""
    labelled = [s for p in panels for s in p.series if s.label]
    legend_width = (max(len(s.label) for s in labelled) * _CHAR + 40) if labelled else 0.0
    legend_width = max(legend_width, len(legend_title) * _CHAR + 16) if labelled else 0.0
    tick_width = max(len(label) for p in panels for _, label in p.y.ticks()) * _CHAR
    left = 22 + tick_width + 10
    x_ticks = x.ticks()
    bottom_labels = max(len(label) for _, label in x_ticks) * _CHAR if x.labels else FONT
    plot_left, plot_right = left, width - 12 - legend_width
    top = 26.0
    gap = 14.0
    height = top + len(panels) * (panel_height + gap) + bottom_labels + 30
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="sans-serif" font-size="{FONT:g}" id="{name}-svg">',
        f'<text x="{(plot_left + plot_right) / 2:.1f}" y="16" text-anchor="middle" font-size="{FONT + 1:g}" '
        f'class="title">{html.escape(title)}</text>',
    ]
    for i, panel in enumerate(panels):
        y0 = top + i * (panel_height + gap)
        box = (plot_left, y0, plot_right, y0 + panel_height)
        out += _panel(name, i, panel, x, box, last=i == len(panels) - 1, x_ticks=x_ticks)
    axis_bottom = top + len(panels) * (panel_height + gap) - gap
    out.append(
        f'<text x="{(plot_left + plot_right) / 2:.1f}" y="{axis_bottom + bottom_labels + 26:.1f}" '
        f'text-anchor="middle" class="xlabel">{html.escape(xlabel)}</text>'
    )
    if labelled:
        out += _legend(name, labelled, legend_title, plot_right + 12, top)
    out.append("</svg>")
    return "\n".join(out)


def _panel(
    name: str, index: int, panel: Panel, x: Scale, box: tuple[float, float, float, float], last: bool, x_ticks: Any
) -> list[str]:
    left, top, right, bottom = box
    w, h = right - left, bottom - top

    def px(value: float) -> float:
        return left + x.fraction(value) * w

    def py(value: float) -> float:
        return bottom - min(1.0, max(0.0, panel.y.fraction(value))) * h

    out = [
        f'<rect id="{name}-axes{index}" x="{left:.1f}" y="{top:.1f}" width="{w:.1f}" height="{h:.1f}" '
        'fill="white" stroke="none"/>',
        f'<g class="yticks" id="{name}-yticks{index}">',
    ]
    for value, label in panel.y.ticks():
        y = py(value)
        out.append(
            f'<line x1="{left:.1f}" x2="{right:.1f}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e4e4e4" stroke-width="0.6"/>'
        )
        out.append(f'<text x="{left - 5:.1f}" y="{y + FONT / 3:.1f}" text-anchor="end">{html.escape(label)}</text>')
    out.append("</g>")
    out.append(f'<g class="xticks" id="{name}-xticks{index}">')
    for value, label in x_ticks:
        xx = px(value)
        if not x.labels:
            out.append(
                f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{top:.1f}" y2="{bottom:.1f}" stroke="#e4e4e4" '
                'stroke-width="0.6"/>'
            )
        out.append(f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{bottom:.1f}" y2="{bottom + 4:.1f}" stroke="#222"/>')
        if last and x.labels:
            out.append(
                f'<text x="{xx:.1f}" y="{bottom + 12:.1f}" text-anchor="end" '
                f'transform="rotate(-35 {xx:.1f} {bottom + 12:.1f})">{html.escape(label)}</text>'
            )
        elif last:
            out.append(f'<text x="{xx:.1f}" y="{bottom + 16:.1f}" text-anchor="middle">{html.escape(label)}</text>')
    out.append("</g>")
    for series in panel.series:
        out += _series(series, x, px, py, bottom)
    out.append(
        f'<path d="M{left:.1f},{top:.1f} V{bottom:.1f} H{right:.1f}" fill="none" stroke="#222" stroke-width="0.8"/>'
    )
    mid = (top + bottom) / 2
    out.append(
        f'<text x="12" y="{mid:.1f}" text-anchor="middle" transform="rotate(-90 12 {mid:.1f})" '
        f'class="ylabel">{html.escape(panel.ylabel)}</text>'
    )
    return out


def _series(series: Series, x: Scale, px: Any, py: Any, bottom: float) -> list[str]:
    colour = series.colour
    dash = f' stroke-dasharray="{series.dash}"' if series.dash else ""
    if series.kind == "bars":
        slot = (px(1.0) - px(0.0)) if len(x.labels) > 1 else (px(0.0) - px(-0.5)) * 2
        return [
            f'<rect x="{px(float(i)) - slot * 0.4:.1f}" y="{py(y):.1f}" width="{slot * 0.8:.1f}" '
            f'height="{max(0.0, bottom - py(y)):.1f}" fill="{colour}">'
            f"<title>{html.escape(x.labels[i])}: {y:.4g}</title></rect>"
            for i, y in enumerate(series.ys)
            if y is not None
        ]
    if series.kind == "stairs":
        points: list[str] = []
        for lo, hi, y in zip(series.edges, series.edges[1:], series.ys):
            level = py(y) if y else bottom  # an empty bin (no place on a log axis) at the axis
            points += [f"{px(lo):.1f},{level:.1f}", f"{px(hi):.1f},{level:.1f}"]
        if series.fill:
            start, end = px(series.edges[0]), px(series.edges[-1])
            return [
                f'<polygon points="{start:.1f},{bottom:.1f} {" ".join(points)} {end:.1f},{bottom:.1f}" '
                f'fill="{colour}" fill-opacity="0.35" stroke="{colour}" stroke-width="0.8"/>'
            ]
        return [
            f'<polyline points="{" ".join(points)}" fill="none" stroke="{colour}" '
            f'stroke-width="{series.width:g}"{dash}><title>{html.escape(series.label)}</title></polyline>'
        ]
    points = [f"{px(xv):.1f},{py(y):.1f}" for xv, y in zip(series.xs, series.ys) if y is not None]
    marks = "".join(f'<circle cx="{p.split(",")[0]}" cy="{p.split(",")[1]}" r="2"/>' for p in points)
    return [
        f'<g fill="{colour}"><polyline points="{" ".join(points)}" fill="none" stroke="{colour}" '
        f'stroke-width="{series.width:g}"{dash}/>{marks}</g>'
    ]


def _legend(name: str, series: list[Series], title: str, left: float, top: float) -> list[str]:
    out = [f'<g id="{name}-legend" class="legend">']
    if title:
        out.append(f'<text x="{left:.1f}" y="{top + FONT:.1f}" font-weight="bold">{html.escape(title)}</text>')
    for i, s in enumerate(series):
        y = top + (i + (2 if title else 1)) * (FONT + 5)
        dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
        out.append(
            f'<line x1="{left:.1f}" x2="{left + 22:.1f}" y1="{y - FONT / 3:.1f}" y2="{y - FONT / 3:.1f}" '
            f'stroke="{s.colour}" stroke-width="{max(s.width, 2.0):g}"{dash}/>'
            f'<text x="{left + 28:.1f}" y="{y:.1f}">{html.escape(s.label)}</text>'
        )
    out.append("</g>")
    return out
