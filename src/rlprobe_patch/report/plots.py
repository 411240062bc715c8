"""The report's plots, drawn from its aggregates (histogram counts, per step too, means per position range and per
decade of probability, one point per module), so that their cost does not grow with the tokens: the token plots by
`svgplot` (a few dozen bars or points: matplotlib's import alone took longer than reading a million tokens, issue
45), the layer plot by matplotlib (imported only when there is a layer compare, no pyplot state), whose x axis names
the modules. Each plot's SVG is inlined with its text kept as text and its legend and axes tagged (`<plot>-legend`,
`<plot>-axes<i>`), so that a browser can check what is shown (tests/runtime/test_report_runtime.py)."""

from __future__ import annotations

import re
from typing import Any

from rlprobe_patch.report import svgplot

_COLOURS = ["#3b6ea8", "#a85a3b", "#4a8f3c", "#8a4aa8", "#c2a02b", "#2ba3a3", "#b0306a", "#555555"]

_DASHES = ["", "6 3", "2 2", "8 3 2 3", "", "6 3", "2 2", "8 3 2 3"]  # with the colours: eight lines told apart


def _svg(fig: Any, name: str) -> str:
    """The figure as an inline <svg> (no XML prologue), its ids unique on the page (`svg.hashsalt` = name)."""
    import io

    import matplotlib

    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": name}):
        fig.savefig(buffer, format="svg", metadata={"Date": None})
    text = buffer.getvalue()
    # matplotlib numbers its groups per figure (`axes_1`, `line2d_3`): prefixed, so that no id repeats on the page
    return re.sub(r'id="([A-Za-z0-9.]+_\d+)"', rf'id="{name}-\1"', text[text.index("<svg") :])


def _figure(name: str, panels: int = 1, width: float = 7.5, height: float = 3.2) -> tuple[Any, list[Any]]:
    """A figure of `panels` axes stacked on one x axis, each axes' background tagged `<name>-axes<i>`."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height * (1 if panels == 1 else 0.62 * panels)), layout="constrained")
    axes = fig.subplots(panels, 1, sharex=True, squeeze=False)[:, 0].tolist()
    for i, ax in enumerate(axes):
        ax.patch.set_gid(f"{name}-axes{i}")
        ax.grid(True, color="#e4e4e4", linewidth=0.6)
        ax.set_axisbelow(True)
    return fig, axes


_SHOWN_STEPS = 8  # the steps the histogram draws one by one (the worst by mean |dlogp| where there are more)


def _histogram(tokens: dict[str, Any]) -> str:
    histogram = tokens["abs_dlogp_histogram"]
    title = f"|dlogp| of {tokens['tokens']} tokens ({histogram['identical']} identical on both sides, not drawn)"
    xlabel = "|log p_train - log p_rollout| per token (log scale)"
    if not histogram["counts"]:
        return svgplot.chart(
            "histogram", title, svgplot.Scale(), [svgplot.Panel(svgplot.Scale(), [], "tokens")], xlabel
        )
    edges, counts = histogram["edges"], histogram["counts"]
    series = [
        svgplot.Series("stairs", counts, edges=edges, colour="#b0b0b0", label=f"all {len(tokens['steps'])} step(s)")
    ]
    means = {(s["step"], s["kind"]): (s.get("scale") or {}).get("mean_abs_dlogp") or 0.0 for s in tokens["steps"]}
    steps = [s for s in histogram.get("steps", []) if any(s["counts"])]
    shown = sorted(steps, key=lambda s: -means.get((s["step"], s["kind"]), 0.0))[:_SHOWN_STEPS]
    for k, s in enumerate(sorted(shown, key=lambda s: histogram["steps"].index(s))):
        mean = means.get((s["step"], s["kind"]), 0.0)
        series.append(
            svgplot.Series(
                "stairs",
                s["counts"],
                edges=edges,
                colour=_COLOURS[k % len(_COLOURS)],
                label=f"step {s['step']} (mean |dlogp| {mean:.3g})",
                fill=False,
                dash=_DASHES[k % len(_DASHES)],
                width=2.0,
            )
        )
    legend = "steps" if len(steps) <= _SHOWN_STEPS else f"the {_SHOWN_STEPS} steps of largest mean |dlogp|"
    panel = svgplot.Panel(svgplot.logarithmic([c for c in counts if c]), series, "tokens (log scale)")
    return svgplot.chart("histogram", title, svgplot.logarithmic(edges), [panel], xlabel, legend_title=legend)


def _by_position(tokens: dict[str, Any]) -> str:
    rows = tokens["by_position"]
    centres = [(r["first"] + r["last"]) / 2 for r in rows]
    dlogp, dp = [r["mean_abs_dlogp"] for r in rows], [r["mean_abs_dp"] for r in rows]
    panels = [
        svgplot.Panel(
            svgplot.linear(dlogp, zero=True),
            [svgplot.Series("line", dlogp, centres, colour=_COLOURS[0])],
            "mean |dlogp|",
        ),
        svgplot.Panel(
            svgplot.linear(dp, zero=True), [svgplot.Series("line", dp, centres, colour=_COLOURS[1])], "mean |dp|"
        ),
    ]
    return svgplot.chart(
        "by_position",
        "difference by position in the response (mean over the tokens at that position)",
        svgplot.linear(centres),
        panels,
        "position in the response",
    )


def _by_probability(tokens: dict[str, Any]) -> str:
    rows = [r for r in tokens["by_probability_decade"] if r["tokens"]]
    labels = [f"<{r['p_to']:.0e}" if r["p_from"] == 0 else f"{r['p_from']:.0e}-{r['p_to']:.0e}" for r in rows]
    counts, dlogp = [float(r["tokens"]) for r in rows], [r["mean_abs_dlogp"] for r in rows]
    panels = [
        svgplot.Panel(
            svgplot.linear(counts, zero=True), [svgplot.Series("bars", counts, colour=_COLOURS[2])], "tokens"
        ),
        svgplot.Panel(
            svgplot.linear(dlogp, zero=True), [svgplot.Series("bars", dlogp, colour=_COLOURS[0])], "mean |dlogp|"
        ),
    ]
    return svgplot.chart(
        "by_probability",
        "difference by the rollout probability of the token (decades)",
        svgplot.Scale(labels=labels),
        panels,
        "rollout probability of the token",
    )


_MARKERS = ["o", "s", "^", "v", "D", "P", "X", "*"]
_NAMED_MODULES = 40  # up to this many modules the x axis names each one; beyond, numbers only


def short_names(names: list[str]) -> list[str]:
    """Module names without the dotted prefix and suffix they all share (`Module.model.`, `.forward.0`)."""
    if len(names) < 2:
        return names
    parts = [n.split(".") for n in names]
    head = 0
    while all(len(p) > head + 1 and p[head] == parts[0][head] for p in parts):
        head += 1
    tail = 0
    while all(len(p) > head + tail + 1 and p[-1 - tail] == parts[0][-1 - tail] for p in parts):
        tail += 1
    return [".".join(p[head : len(p) - tail]) for p in parts]


def _coincide(a: list[Any], b: list[Any]) -> bool:
    """Two pairs' values that draw the same line: the same modules, each within a thousandth of the values' range."""
    if len(a) != len(b) or any((x is None) != (y is None) for x, y in zip(a, b)):
        return False
    known = [v for v in a + b if v is not None]
    span = (max(known) - min(known)) if known else 0.0
    return all(x is None or abs(x - y) <= 1e-3 * span for x, y in zip(a, b))


def _layers(layers: dict[str, Any]) -> str:
    pairs = layers["pairs"][:12]
    statistics = pairs[0]["mode"] == "statistics"
    fig, (ax,) = _figure("layers", width=10.5, height=5.2)
    ax.set_title("layer divergence, module by module")
    values = [[m["max_diff"] if statistics else m["cosine"] for m in pair["modules"]] for pair in pairs]
    firsts = set()
    for k, (pair, ys) in enumerate(zip(pairs, values)):
        # pairs whose lines coincide (to a thousandth of the axis) would hide each other: each one under a later
        # one is drawn wider, and each pair's markers sit side by side within the module's slot
        same_later = sum(1 for other in values[k + 1 :] if _coincide(ys, other))
        dodge = (k - (len(pairs) - 1) / 2) * min(0.08, 0.6 / len(pairs))
        ax.plot(
            [i + dodge for i in range(1, len(ys) + 1)],  # one-based, as the text counts modules ("module 12 of 14")
            [float("nan") if y is None else y for y in ys],
            marker=_MARKERS[k % len(_MARKERS)],
            markersize=3.5,
            linewidth=1.0 + 1.3 * same_later,
            linestyle=["-", "--", "-.", ":"][(k // len(_COLOURS)) % 4],
            color=_COLOURS[k % len(_COLOURS)],
            label=pair["label"],
            zorder=2 + k,
            gid=f"layers-pair-{k}",
        )
        first = next((i for i, m in enumerate(pair["modules"]) if m["diverges"]), None)
        if first is not None and first not in firsts:
            firsts.add(first)
            ax.axvline(first + 1, color="red", linestyle="--", linewidth=0.9, alpha=0.7, zorder=1,
                       gid=f"layers-first-divergence-{first + 1}")  # fmt: skip
    longest = max(pairs, key=lambda p: len(p["modules"]))
    names = short_names([m["module"] for m in longest["modules"]])
    if len(names) <= _NAMED_MODULES:
        ax.set_xticks(range(1, len(names) + 1), [f"{i} {n}" for i, n in enumerate(names, start=1)], rotation=40,
                      ha="right", rotation_mode="anchor", fontsize=7)  # fmt: skip
        for i, label in enumerate(ax.get_xticklabels(), start=1):
            label.set_gid(f"layers-xtick-{i}")
    ax.set_xlabel("module, in forward order (numbered as in the tables below)")
    ax.set_ylabel("|max diff|" if statistics else "cosine")
    legend = fig.legend(loc="outside right upper", fontsize=7, title="run / pair (request id)", title_fontsize=7)
    legend.set_gid("layers-legend")
    return _svg(fig, "layers")


def plots(report: dict[str, Any]) -> dict[str, str]:
    """name -> inline SVG, drawn from the report's aggregates (histogram counts, binned means): the token plots by
    `svgplot`, the layer plot by matplotlib (imported only for it)."""
    out: dict[str, str] = {}
    tokens = report.get("tokens")
    if tokens and tokens["tokens"]:
        out["histogram"] = _histogram(tokens)
        out["by_position"] = _by_position(tokens)
        if sum(1 for r in tokens["by_probability_decade"] if r["tokens"]) > 1:
            out["by_probability"] = _by_probability(tokens)
    layers = report.get("layers")
    if layers and layers["pairs"]:
        import matplotlib

        # text stays text in the SVG (readable, searchable, checked by the browser test)
        with matplotlib.rc_context(
            {"svg.fonttype": "none", "font.size": 9, "axes.spines.top": False, "axes.spines.right": False}
        ):
            out["layers"] = _layers(layers)
    return out
