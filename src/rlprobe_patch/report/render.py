"""report.html: one self-contained page (plots as base64 SVG drawn here, no script, no link out) and the text summary.

The plots are drawn from the report's aggregates (histogram counts, means per position range and per
probability bin, one point per module), so their cost does not grow with the tokens; no plotting
library is imported.
"""

from __future__ import annotations

import base64
import html
import math
from typing import Any

_W, _H = 640, 320  # every plot's size in pixels
_LEFT, _RIGHT, _TOP, _BOTTOM = 70, 20, 28, 56
_COLOURS = ["#3b6ea8", "#a85a3b", "#4a8f3c", "#8a4aa8", "#c2a02b", "#2ba3a3", "#b0306a", "#555555"]


def _nice_ticks(low: float, high: float, log: bool) -> list[float]:
    if log:
        first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
        step = max(1, math.ceil((last - first) / 8))
        return [10.0**e for e in range(first, last + 1, step) if low <= 10.0**e <= high]
    if high <= low:
        return [low]
    raw = (high - low) / 5
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    first = math.ceil(low / step) * step
    return [first + i * step for i in range(int((high - first) / step + 1e-9) + 1)]


def _label(value: float) -> str:
    return f"{value:.3g}" if value == 0 or 1e-3 <= abs(value) < 1e4 else f"{value:.0e}"


class _Plot:
    """One SVG chart: axes (linear or logarithmic), ticks, labels; bars, lines and marks added in data units."""

    def __init__(
        self,
        x: tuple[float, float],
        y: tuple[float, float],
        *,
        title: str,
        x_label: str,
        y_label: str,
        x_log: bool = False,
        y_log: bool = False,
        x_ticks: list[tuple[float, str]] | None = None,
    ) -> None:
        self.x, self.y, self.x_log, self.y_log = x, y, x_log, y_log
        self.parts: list[str] = []
        self.legend: list[tuple[str, str]] = []
        self._axes(title, x_label, y_label, x_ticks)

    def _to(self, value: float, span: tuple[float, float], log: bool, a: float, b: float) -> float:
        lo, hi = span
        if log:
            value, lo, hi = (math.log10(max(v, 1e-300)) for v in (value, lo, hi))
        fraction = 0.5 if hi == lo else (value - lo) / (hi - lo)
        return a + (b - a) * min(1.0, max(0.0, fraction))

    def px(self, x: float) -> float:
        return self._to(x, self.x, self.x_log, _LEFT, _W - _RIGHT)

    def py(self, y: float) -> float:
        return self._to(y, self.y, self.y_log, _H - _BOTTOM, _TOP)

    def _axes(self, title: str, x_label: str, y_label: str, x_ticks: list[tuple[float, str]] | None) -> None:
        left, right, top, bottom = _LEFT, _W - _RIGHT, _TOP, _H - _BOTTOM
        add = self.parts.append
        add(f'<rect x="{left}" y="{top}" width="{right - left}" height="{bottom - top}" fill="none" stroke="#888"/>')
        ticks = x_ticks or [(v, _label(v)) for v in _nice_ticks(*self.x, self.x_log)]
        for value, text in ticks:
            x = self.px(value)
            add(f'<line x1="{x:.1f}" y1="{bottom}" x2="{x:.1f}" y2="{bottom + 4}" stroke="#888"/>')
            add(f'<text x="{x:.1f}" y="{bottom + 16}" font-size="10" text-anchor="middle">{html.escape(text)}</text>')
        for value in _nice_ticks(*self.y, self.y_log):
            y = self.py(value)
            add(f'<line x1="{left - 4}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" stroke="#ddd"/>')
            add(f'<text x="{left - 6}" y="{y + 3:.1f}" font-size="10" text-anchor="end">{_label(value)}</text>')
        middle = (left + right) / 2
        add(f'<text x="{middle}" y="{_H - 18}" font-size="12" text-anchor="middle">{html.escape(x_label)}</text>')
        add(
            f'<text x="14" y="{(top + bottom) / 2}" font-size="12" text-anchor="middle" '
            f'transform="rotate(-90 14 {(top + bottom) / 2})">{html.escape(y_label)}</text>'
        )
        add(f'<text x="{(left + right) / 2}" y="18" font-size="13" text-anchor="middle">{html.escape(title)}</text>')

    def bar(self, x0: float, x1: float, height: float, colour: str) -> None:
        if height <= 0:
            return
        base = self.py(self.y[0])
        left, right, top = self.px(x0), self.px(x1), self.py(height)
        self.parts.append(
            f'<rect x="{left:.1f}" y="{top:.1f}" width="{max(right - left - 1, 1):.1f}" '
            f'height="{base - top:.1f}" fill="{colour}"/>'
        )

    def line(self, xs: list[float], ys: list[float | None], colour: str, label: str, marker: bool = True) -> None:
        points = [(self.px(x), self.py(y)) for x, y in zip(xs, ys) if y is not None and math.isfinite(y)]
        if points:
            text = " ".join(f"{a:.1f},{b:.1f}" for a, b in points)
            self.parts.append(f'<polyline points="{text}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
            if marker and len(points) <= 120:
                self.parts += [f'<circle cx="{a:.1f}" cy="{b:.1f}" r="2.5" fill="{colour}"/>' for a, b in points]
        self.legend.append((label, colour))

    def vline(self, x: float, colour: str) -> None:
        a = self.px(x)
        self.parts.append(
            f'<line x1="{a:.1f}" y1="{_TOP}" x2="{a:.1f}" y2="{_H - _BOTTOM}" stroke="{colour}" '
            'stroke-dasharray="4 3" opacity="0.6"/>'
        )

    def svg(self) -> str:
        for i, (label, colour) in enumerate(self.legend):
            y = _TOP + 14 + 13 * i
            self.parts.append(
                f'<rect x="{_W - _RIGHT - 150}" y="{y - 8}" width="10" height="10" fill="{colour}"/>'
                f'<text x="{_W - _RIGHT - 136}" y="{y + 1}" font-size="10">{html.escape(label[:28])}</text>'
            )
        body = "".join(self.parts)
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" viewBox="0 0 {_W} {_H}" '
            f'font-family="sans-serif"><rect width="{_W}" height="{_H}" fill="white"/>{body}</svg>'
        )


def _encode(svg: str) -> str:
    return base64.b64encode(svg.encode()).decode("ascii")


def plots(report: dict[str, Any]) -> dict[str, str]:
    """name -> base64 SVG, drawn from the report's aggregates (histogram counts, binned means), never per token."""
    out: dict[str, str] = {}
    tokens = report.get("tokens")
    if tokens and tokens["tokens"]:
        histogram = tokens["abs_dlogp_histogram"]
        edges, counts = histogram["edges"], histogram["counts"]
        title = f"{tokens['tokens']} tokens, {histogram['identical']} identical"
        if counts:
            plot = _Plot(
                (edges[0], edges[-1]),
                (0.8, max(counts) * 1.5),
                title=title,
                x_label="|log p_train - log p_rollout| per token",
                y_label="tokens",
                x_log=True,
                y_log=True,
            )
            for i, count in enumerate(counts):
                plot.bar(edges[i], edges[i + 1], count, _COLOURS[0])
        else:
            plot = _Plot((0.0, 1.0), (0.0, 1.0), title=title, x_label="|dlogp| per token (all 0)", y_label="tokens")
        out["histogram"] = _encode(plot.svg())
        rows = tokens["by_position"]
        centres = [(r["first"] + r["last"]) / 2 for r in rows]
        top = max([r["mean_abs_dlogp"] for r in rows] + [r["mean_abs_dp"] for r in rows] + [1e-12])
        plot = _Plot(
            (min(centres), max(centres) if len(centres) > 1 else min(centres) + 1),
            (0.0, top * 1.1),
            title="difference by position in the response",
            x_label="position in the response",
            y_label="mean difference",
        )
        plot.line(centres, [r["mean_abs_dlogp"] for r in rows], _COLOURS[0], "mean |dlogp|")
        plot.line(centres, [r["mean_abs_dp"] for r in rows], _COLOURS[1], "mean |dp|")
        out["by_position"] = _encode(plot.svg())
        rows = tokens["by_probability"]
        values = [r["mean_abs_dlogp"] or 0.0 for r in rows]
        plot = _Plot(
            (0.0, float(len(rows))),
            (0.0, max(values + [1e-12]) * 1.1),
            title="difference by the rollout probability of the token",
            x_label="rollout probability of the token",
            y_label="mean |dlogp|",
            x_ticks=[(i + 0.5, f"{r['p_from']:.1f}-{r['p_to']:.1f}") for i, r in enumerate(rows)],
        )
        for i, value in enumerate(values):
            plot.bar(i + 0.1, i + 0.9, value, _COLOURS[1])
        out["by_probability"] = _encode(plot.svg())
    layers = report.get("layers")
    if layers and layers["pairs"]:
        pairs = layers["pairs"][:12]
        mode = pairs[0]["mode"]
        series = []
        for pair in pairs:
            ys = [m["cosine"] if pair["mode"] == "tensor" else m["max_diff"] for m in pair["modules"]]
            series.append([float(y) if y is not None and math.isfinite(y) else None for y in ys])
        finite = [y for ys in series for y in ys if y is not None]
        low, high = (min(finite), max(finite)) if finite else (0.0, 1.0)
        pad = (high - low) * 0.05 or 0.05
        plot = _Plot(
            (0.0, float(max(1, max(len(p["modules"]) for p in pairs) - 1))),
            (low - pad, high + pad),
            title="layer divergence (dashed: first module out of msprobe's thresholds)",
            x_label="module, in forward order",
            y_label="cosine" if mode == "tensor" else "|max diff|",
        )
        for k, (pair, ys) in enumerate(zip(pairs, series)):
            colour = _COLOURS[k % len(_COLOURS)]
            plot.line([float(i) for i in range(len(ys))], list(ys), colour, pair["pair"])
            first = next((i for i, m in enumerate(pair["modules"]) if m["diverges"]), None)
            if first is not None:
                plot.vline(float(first), "red")
        out["layers"] = _encode(plot.svg())
    return out


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.6g}"
    return html.escape(str(value))


def _table(headers: list[str], rows: list[list[Any]], css: str = "") -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_fmt(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{css}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _img(images: dict[str, str], name: str, alt: str) -> str:
    if name not in images:
        return ""
    return (
        f'<figure id="plot-{name}"><img alt="{html.escape(alt)}" width="{_W}" height="{_H}" '
        f'src="data:image/svg+xml;base64,{images[name]}"></figure>'
    )


_STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.85em; }
th, td { border: 1px solid #bbb; padding: 2px 6px; text-align: right; }
th { background: #eee; } td:first-child { text-align: left; }
.crossed { color: #b00; font-weight: bold; } .ok { color: #070; } .warn { color: #a60; }
figure { display: inline-block; margin: 0.5em; }
"""


def render_html(report: dict[str, Any], images: dict[str, str], top: int) -> str:
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>rlprobe-patch report</title>",
        f"<style>{_STYLE}</style></head><body><h1>Training vs rollout: rlprobe-patch report</h1>",
    ]
    checks = report.get("thresholds") or []
    if checks:
        parts.append("<h2>Thresholds</h2>")
        for c in checks:
            state = "no value" if c["crossed"] is None else ("CROSSED" if c["crossed"] else "within")
            css = "crossed" if c["crossed"] else "ok"
            parts.append(
                f'<p class="{css} threshold">{html.escape(c["option"])} {c["limit"]}: {html.escape(c["metric"])} = '
                f"{_fmt(c['value'])} ({state})</p>"
            )
    tokens = report.get("tokens")
    if tokens:
        parts.append(
            f"<h2>Tokens</h2><p id='token-count'>{tokens['samples']} request(s), {tokens['tokens']} response "
            f"token(s), {tokens['empty_responses']} empty response(s), {len(tokens['steps'])} step(s)</p>"
        )
        parts.append("<h3>verl's metrics, all steps together</h3>")
        parts.append(_table(["metric", "value"], [[k, v] for k, v in tokens["overall"].items()], "metrics"))
        parts.append("<h3>Per step</h3>")
        keys = [
            "training/rollout_probs_diff_max",
            "training/rollout_probs_diff_mean",
            "rollout_corr/kl",
            "rollout_corr/k3_kl",
            "training/rollout_actor_probs_pearson_corr",
        ]
        parts.append(
            _table(
                ["step", "source", "samples", "tokens", *keys],
                [
                    [s["step"], s["kind"], s["samples"], s["tokens"], *(s["metrics"].get(k) for k in keys)]
                    for s in tokens["steps"]
                ],
            )
        )
        parts.append(f"<h3>The {top} worst requests (by max |dp|)</h3>")
        rows = []
        for r in [r for r in tokens["requests"] if r["tokens"]][:top]:
            w = r["worst_token"]
            rows.append(
                [
                    r["rank"],
                    r["request_id"],
                    r["step"],
                    r["dataset_index"],
                    r["tokens"],
                    r["max_abs_dp"],
                    r["mean_abs_dp"],
                    r["max_abs_dlogp"],
                    r["mean_abs_dlogp"],
                    w["position"],
                    w["token_id"],
                ]
            )
        parts.append(
            _table(
                [
                    "rank",
                    "request",
                    "step",
                    "dataset index",
                    "tokens",
                    "max |dp|",
                    "mean |dp|",
                    "max |dlogp|",
                    "mean |dlogp|",
                    "worst position",
                    "worst token id",
                ],
                rows,
                "worst-requests",
            )
        )
        parts.append("<h3>Distribution</h3>")
        parts.append(_img(images, "histogram", "histogram of |dlogp|"))
        parts.append(_img(images, "by_position", "difference by position in the response"))
        parts.append(_img(images, "by_probability", "difference by token probability"))
        parts.append(
            _table(
                ["rollout p", "tokens", "mean |dlogp|", "mean |dp|", "share of |dlogp|"],
                [
                    [
                        f"{r['p_from']:.1f}-{r['p_to']:.1f}",
                        r["tokens"],
                        r["mean_abs_dlogp"],
                        r["mean_abs_dp"],
                        r["share_of_abs_dlogp"],
                    ]
                    for r in tokens["by_probability"]
                ],
            )
        )
    layers = report.get("layers")
    if layers:
        parts.append("<h2>Layers (msprobe compare)</h2>")
        parts.append(
            f"<p id='common-divergence'>first divergence common to every disagreeing pair: "
            f"{_fmt(layers['first_common_divergence'])} ({len(layers['disagreeing_pairs'])} of "
            f"{len(layers['pairs'])} pair(s) disagree)</p>"
        )
        parts.append(_img(images, "layers", "layer divergence chart"))
        for pair in layers["pairs"]:
            parts.append(
                f"<h3>{html.escape(pair['pair'])}</h3><p>first module out of msprobe's thresholds: "
                f"{_fmt(pair['first_divergence'])}</p>"
            )
            parts.append(
                _table(
                    ["module", "cosine", "max abs err", "|max diff|", "Result", "out of thresholds"],
                    [
                        [
                            m["module"],
                            m["cosine"],
                            m["max_abs_err"],
                            m["max_diff"],
                            m["result"],
                            "yes" if m["diverges"] else "",
                        ]
                        for m in pair["modules"]
                    ],
                    "modules",
                )
            )
    replay = report.get("replay")
    if replay and replay.get("command"):
        parts.append(
            f"<h2>Replay</h2><p>prompts: {html.escape(replay['prompts'])}</p><pre>{html.escape(replay['command'])}"
            f"\n  then in the derived script: {html.escape(' '.join(replay['overrides']))}</pre>"
        )
    if replay and replay.get("why_not"):
        what = "requests left out of replay_prompts.jsonl" if replay["prompts"] else "replay_prompts.jsonl not written"
        parts.append(f"<p id='replay-why-not' class='warn'>{what}: {html.escape(replay['why_not'])}</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def summary_lines(report: dict[str, Any], top: int) -> list[str]:
    lines = []
    tokens = report.get("tokens")
    if tokens:
        o = tokens["overall"]
        lines.append(
            f"tokens: {tokens['samples']} request(s), {tokens['tokens']} token(s) in {len(tokens['steps'])} step(s)"
        )
        lines.append(
            f"  probs diff max {_fmt(o.get('training/rollout_probs_diff_max'))}, "
            f"mean {_fmt(o.get('training/rollout_probs_diff_mean'))}; kl {_fmt(o.get('kl'))}, "
            f"k3_kl {_fmt(o.get('k3_kl'))}; pearson {_fmt(o.get('training/rollout_actor_probs_pearson_corr'))}"
        )
        for r in [r for r in tokens["requests"] if r["tokens"]][:top]:
            w = r["worst_token"]
            lines.append(
                f"  #{r['rank']} {r['request_id']} (step {r['step']}): max |dp| {_fmt(r['max_abs_dp'])}, "
                f"max |dlogp| {_fmt(r['max_abs_dlogp'])} at position {w['position']} (token {w['token_id']})"
            )
    layers = report.get("layers")
    if layers:
        lines.append(
            f"layers: {len(layers['disagreeing_pairs'])} of {len(layers['pairs'])} pair(s) disagree; "
            f"first common divergence: {layers['first_common_divergence'] or '-'}"
        )
        for pair in layers["pairs"]:
            lines.append(f"  {pair['pair']}: first divergence {pair['first_divergence'] or '-'}")
    return lines
