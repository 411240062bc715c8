"""report.html: one self-contained page (plots as inline SVG, no script, no link out) and the text summary.

The plots are drawn from the report's aggregates (histogram counts, per step too, means per position range
and per decade of probability, one point per module), so their cost does not grow with the tokens: the token
plots by `svgplot` (a few dozen bars or points: matplotlib's import alone took longer than reading a
million tokens, issue 45), the layer plot by matplotlib (imported only when there is a layer compare, no
pyplot state), whose x axis names the modules. Each plot's SVG is inlined with its text kept as text and its
legend and axes tagged (`<plot>-legend`, `<plot>-axes<i>`), so that a browser can check what is shown
(tests/runtime/test_report_runtime.py).
"""

from __future__ import annotations

import html
import math
import re
from typing import Any

from rlprobe_patch.report import svgplot
from rlprobe_patch.report.next_steps import next_steps

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


class _Raw(str):
    """A table cell's HTML, written as it is."""


def _fmt(value: Any) -> str:
    if isinstance(value, _Raw):
        return str(value)
    if value is None:
        return "-"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.6g}"
    return html.escape(str(value))


class _State(str):
    """A state word in a cell, coloured by its class (`ok`, `warn`, `fail`)."""

    def __new__(cls, text: str, css: str) -> _State:
        state = super().__new__(cls, text)
        state.css = css
        return state

    css: str


def _cell(value: Any) -> str:
    if isinstance(value, _State):
        return f"<td class='text {html.escape(value.css)}'>{_fmt(value)}</td>"
    if isinstance(value, _Raw):
        return f"<td class='id'>{value}</td>"
    if isinstance(value, str):  # words read from the left; numbers line up on the right
        return f"<td class='text'>{_fmt(value)}</td>"
    return f"<td>{_fmt(value)}</td>"


def _table(headers: list[str], rows: list[list[Any]], css: str = "") -> str:
    # verl's long metric names may break after an underscore: a table as wide as the page, not wider
    head = "".join(f"<th>{html.escape(h).replace('_', '_<wbr>')}</th>" for h in headers)
    body = "".join("<tr>" + "".join(map(_cell, row)) + "</tr>" for row in rows)
    return f'<table class="{css}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _figure_html(images: dict[str, str], name: str, caption: str) -> str:
    if name not in images:
        return ""
    return f'<figure id="plot-{name}">{images[name]}<figcaption>{html.escape(caption)}</figcaption></figure>'


_STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; max-width: 1400px; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.85em; }
th, td { border: 1px solid #bbb; padding: 2px 6px; text-align: right; }
th { background: #eee; } td:first-child { text-align: left; }
td.id { font-family: monospace; white-space: nowrap; text-align: left; } td.text { text-align: left; }
.crossed, .fail { color: #b00; font-weight: bold; } .ok { color: #070; } .warn { color: #a60; }
figure { margin: 0.5em 0 1.5em; } figure svg { max-width: 100%; height: auto; }
figcaption { font-size: 0.85em; color: #555; }
pre { background: #f4f4f4; padding: 0.5em; white-space: pre-wrap; }
#verdict { border-left: 6px solid #888; padding: 0.3em 1em; } #verdict.state-fail { border-color: #b00; }
#verdict.state-warn { border-color: #a60; } #verdict.state-ok { border-color: #070; }
"""

_STEP_KEYS = [
    "training/rollout_probs_diff_max",
    "training/rollout_probs_diff_mean",
    "rollout_corr/kl",
    "rollout_corr/k3_kl",
    "training/rollout_actor_probs_pearson_corr",
]


def _id(value: str) -> str:
    """A request id in full (never cut), in a cell of its own."""
    return f'<span title="{html.escape(value)}">{html.escape(value)}</span>'


def _verdict_html(report: dict[str, Any]) -> list[str]:
    judged = report.get("verdict")
    if not judged:
        return []
    state = judged["state"]
    css = state if state in ("ok", "warn", "fail") else ""
    parts = [
        f'<section id="verdict" class="state-{css}"><h2 class="{css}">Verdict: {html.escape(state.upper())}</h2>',
        f"<p>by {html.escape(judged['metric'])} against verl's guidance: warning above {judged['warn']}, "
        f"mismatch above {judged['fail']} ({html.escape(judged['source'])}); where the tokens are too unlikely for "
        f"that number to say anything, by the log-probs (mean exp(|dlogp|) against "
        f"{judged['log_prob_gate']['token_multiplicative_error']}, {html.escape(judged['log_prob_gate']['source'])})"
        + ("" if judged.get("decides_exit", True) else "; the threshold options given decide the exit code")
        + "</p><ul>",
    ]
    sources = [f"step {s['step']}" for s in judged["steps"] if s["state"] == state]
    layers = report.get("layers")
    out_of_floor = _layer_disagreeing(report)
    if layers and out_of_floor and state == "fail":
        sources.append(f"the layer compare ({len(out_of_floor)} of {len(layers['pairs'])} pairs)")
    if state in ("warn", "fail") and sources:
        parts.insert(1, f"<p id='verdict-from'>{html.escape(state.upper())} from {html.escape(', '.join(sources))}</p>")
    parts += [f"<li>{html.escape(reason)}</li>" for reason in judged["reasons"]]
    parts.append("</ul>")
    diagnosis = report.get("diagnosis")
    if diagnosis and diagnosis.get("causes") and diagnosis.get("steps"):
        top = diagnosis["causes"][0]
        parts.append(
            f"<p id='top-cause'>Top cause (<a href='#diagnosis'>diagnosis</a>): <b>{html.escape(top['cause'])}</b> "
            f"({top['score']:.2f}), {html.escape(top['title'])}; {html.escape(top['evidence'])}</p>"
        )
    parts.append("</section>")
    return parts


def _floor_state(step: dict[str, Any] | None, floor: dict[str, Any]) -> _State | None:
    """A step against the diagnosis's noise floor: within, or out and how far (its mean |dlogp| over the limit)."""
    if step is None:
        return None
    if step["within_floor"]:
        return _State("within", "ok")
    return _State(f"out, {step['mean_abs_dlogp'] / floor['mean_limit']:.3g}x", "fail")


def _tokens_html(
    tokens: dict[str, Any],
    images: dict[str, str],
    top: int,
    verdict: dict[str, Any],
    diagnosis: dict[str, Any] | None = None,
) -> list[str]:
    graded = {(s["step"], s["kind"]): s for s in (verdict or {}).get("steps", [])}
    # each step against the noise floor too: verl's number can grade every step ok under a FAIL that the layer
    # compare or the log-probs found (a stale rollout: its steps ok by verl's number, out of the measured floor)
    judged = {(s["step"], s["kind"]): s for s in (diagnosis or {}).get("steps", [])}
    parts = [
        f"<h2>Tokens</h2><p id='token-count'>{tokens['samples']} request(s), {tokens['tokens']} response "
        f"token(s), {tokens['empty_responses']} empty response(s), {len(tokens['steps'])} step(s)</p>",
        "<h3>Per step (verl logs these numbers per step)</h3>",
    ]
    rows = []
    for s in tokens["steps"]:
        g = graded.get((s["step"], s["kind"]), {})
        scale = s.get("scale") or {}
        rows.append(
            [
                s["step"],
                s["kind"],
                s["samples"],
                s["tokens"],
                _State(g["state"], g["state"]) if g.get("state") else None,
                _floor_state(judged.get((s["step"], s["kind"])), diagnosis["floor"]) if diagnosis else None,
                *(s["metrics"].get(k) for k in _STEP_KEYS),
                scale.get("probs_diff_mean_ceiling"),
                scale.get("mean_abs_dlogp"),
                scale.get("token_multiplicative_error"),
            ]
        )
    floor = "measured" if diagnosis and diagnosis["floor"]["measured"] else "fixed gate"
    headers = ["step", "source", "samples", "tokens", "by verl's number", f"noise floor ({floor})"]
    headers += [k.split("/")[-1] for k in _STEP_KEYS]
    headers += ["most diff_mean could be", "mean |dlogp|", "mean exp(|dlogp|)"]
    parts.append(_table(headers, rows, "steps"))
    parts.append(
        "<p class='note'>verl's names: training/rollout_probs_diff_{max,mean}, rollout_corr/{kl,k3_kl}, "
        "training/rollout_actor_probs_pearson_corr. <i>most diff_mean could be</i>: the mean of max(p_train, "
        "p_rollout), the largest rollout_probs_diff_mean these tokens could give whatever the mismatch.</p>"
    )
    parts.append("<details><summary>verl's metrics, all steps together</summary>")
    parts.append(_table(["metric", "value"], [[k, v] for k, v in tokens["overall"].items()], "metrics"))
    parts.append("</details>")
    # a request id once, at its worst step (a run that replays the same requests step after step has them in
    # every step), with the steps it is among the worst in
    steps_of: dict[str, list[Any]] = {}
    worst: list[dict[str, Any]] = []
    for r in (r for r in tokens["requests"] if r["tokens"]):
        if r["request_id"] not in steps_of:
            if len(worst) == top:
                continue
            worst.append(r)
        steps_of.setdefault(r["request_id"], []).append(r["step"])
    parts.append(f"<h3 id='worst-heading'>The {len(worst)} worst requests (by max |dp|, each at its worst step)</h3>")
    rows = []
    for r in worst:
        w = r["worst_token"]
        also = [s for s in steps_of[r["request_id"]] if s != r["step"]]
        rows.append(
            [
                r["rank"],
                _Raw(_id(r["request_id"])),
                f"{r['step']}" + (f" (also in {', '.join(map(str, also))})" if also else ""),
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
    headers = ["rank", "request", "step", "dataset index", "tokens", "max |dp|", "mean |dp|", "max |dlogp|"]
    headers += ["mean |dlogp|", "worst position", "worst token id"]
    parts.append(_table(headers, rows, "worst-requests"))
    parts.append("<h3>Distribution</h3>")
    parts.append(_figure_html(images, "histogram", "How far the two sides' log-probs are apart, token by token."))
    parts.append(
        _figure_html(images, "by_position", "Does the difference grow along the response? (|dlogp|, |dp|: own axes)")
    )
    parts.append(
        _figure_html(
            images,
            "by_probability",
            "Where the tokens' probabilities lie, and the difference there: |dp| cannot be "
            "large on unlikely tokens, |dlogp| can.",
        )
    )
    filled = [r for r in tokens["by_probability_decade"] if r["tokens"]]
    if len(filled) == 1:
        parts.append(
            f"<p id='one-decade'>All {filled[0]['tokens']} tokens have a rollout probability between "
            f"{filled[0]['p_from']:.0e} and {filled[0]['p_to']:.0e}: no chart by probability. On tokens this unlikely "
            "|dp| stays small whatever the mismatch; |dlogp| does not.</p>"
        )
    decade_rows = [
        [f"{r['p_from']:.0e}-{r['p_to']:.0e}", r["tokens"], r["mean_abs_dlogp"], r["mean_abs_dp"]]
        for r in tokens["by_probability_decade"]
        if r["tokens"]
    ]
    parts.append(_table(["rollout p", "tokens", "mean |dlogp|", "mean |dp|"], decade_rows, "by-decade"))
    return parts


def _module_state(module: dict[str, Any]) -> str:
    """One word on a module against msprobe's thresholds, and why when out: its Result column, else the accuracy
    rule on cosine and MaxAbsErr (which can fail where Result says pass: a row never says both)."""
    if not module["diverges"]:
        return "within"
    if module["result"] in ("warning", "error"):
        return f"out ({module['result']})"
    return (
        "out (msprobe's accuracy rule: cosine below 0.99 with max abs err above 0.001, cosine below 0.9 or max abs "
        "err above 1)"
    )


def _layer_disagreeing(report: dict[str, Any]) -> list[str]:
    """The pairs out of the layer floor as the diagnosis read them, else those msprobe's thresholds flag."""
    view = (report.get("diagnosis") or {}).get("layers")
    return list(view["disagreeing"]) if view else list((report.get("layers") or {}).get("disagreeing_pairs", []))


def _layer_reading(report: dict[str, Any]) -> str:
    """One sentence on the layer compare: against its floor where the diagnosis read it, msprobe's own count."""
    layers = report["layers"]
    view = (report.get("diagnosis") or {}).get("layers")
    flagged = f"msprobe's thresholds flag {len(layers['disagreeing_pairs'])} of {len(layers['pairs'])} pair(s)"
    if not view:
        return (
            f"first divergence common to every disagreeing pair: {_fmt(layers['first_common_divergence'])} ({flagged})"
        )
    noise = f", {len(view['within_floor'])} of them within the floor (float rounding)" if view["within_floor"] else ""
    return (
        f"first module out of the layer floor common to every pair that leaves it: {_fmt(view['first_common'])} "
        f"({len(view['disagreeing'])} of {view['pairs']} pair(s) out of the floor; {flagged}{noise})"
    )


def _layers_html(report: dict[str, Any], images: dict[str, str]) -> list[str]:
    layers = report["layers"]
    parts = [
        "<h2>Layers (msprobe compare)</h2>",
        f"<p id='common-divergence'>{html.escape(_layer_reading(report))}</p>",
        _figure_html(
            images,
            "layers",
            "One line per pair; dashed: a pair's first module out of msprobe's thresholds. The "
            "tables below name each module.",
        ),
    ]
    for pair in sorted(layers["pairs"], key=lambda p: p["first_divergence"] is None):
        tensor = pair["mode"] == "tensor"
        headers = ["#", "module", *(["cosine", "max abs err"] if tensor else ["|max diff|"]), "msprobe's thresholds"]
        rows = [
            [
                i,
                m["module"],
                *([m["cosine"], m["max_abs_err"]] if tensor else [m["max_diff"]]),
                _module_state(m),
            ]
            for i, m in enumerate(pair["modules"], start=1)
        ]
        agrees = pair["first_divergence"] is None
        parts.append(
            f"<h3 class='pair'>{html.escape(pair.get('heading') or pair['pair'])}</h3><p>first module out of "
            f"msprobe's thresholds: {_fmt(pair['first_divergence'])}; CSV: {html.escape(pair['path'])}</p>"
        )
        table = _table(headers, rows, "modules")
        folded = f"<details><summary>{len(rows)} modules, all within msprobe's thresholds</summary>{table}</details>"
        parts.append(folded if agrees else table)
    return parts


_SHOWN_CAUSES = 3  # the causes the summary and the page name first; report.json holds them all


def _shown(diagnosis: dict[str, Any]) -> list[dict[str, Any]]:
    """The first causes of the run's ranking, those with a score."""
    return [c for c in diagnosis["causes"][:_SHOWN_CAUSES] if round(c["score"], 2) > 0] or diagnosis["causes"][:1]


def _step_tops(diagnosis: dict[str, Any]) -> str:
    return "; ".join(
        f"step {s['step']}: {'within the floor' if s['within_floor'] else 'out of the floor'}, "
        f"{s['causes'][0]['cause']} first ({s['causes'][0]['score']:.2f})"
        for s in diagnosis["steps"][:12]
    ) + (f"; ... {len(diagnosis['steps']) - 12} more" if len(diagnosis["steps"]) > 12 else "")


def diagnosis_lines(report: dict[str, Any]) -> list[str]:
    """The diagnosis in the text summary: the floor, the first causes with their evidence and confirming runs."""
    diagnosis = report.get("diagnosis")
    if not diagnosis:
        return []
    lines = [f"diagnosis (noise floor {'measured' if diagnosis['floor']['measured'] else 'not measured'}): "
             f"{diagnosis['floor']['how']}"]  # fmt: skip
    if not diagnosis["steps"]:
        return [*lines, "  no response token: nothing to diagnose"]
    for rank, c in enumerate(_shown(diagnosis), start=1):
        lines.append(f"  {rank}. {c['cause']} ({c['score']:.2f}): {c['title']}; {c['evidence']}")
        lines += [f"     confirm: {line}" for line in c["confirm"]]
    lines.append(f"  {_step_tops(diagnosis)}")
    clip = diagnosis.get("clip")
    if clip:
        shares = ", ".join(
            f"step {s['step']} {s['clip']['total']:.1%}" for s in diagnosis["steps"][:12] if s.get("clip")
        )
        lines.append(
            f"  tokens the gap alone would clip at step 0 (ratio outside [1 - {clip['low']:g}, 1 + {clip['high']:g}], "
            f"{clip.get('source', 'the run')}): {shares}"
        )
    return lines


def _diagnosis_html(diagnosis: dict[str, Any]) -> list[str]:
    floor = diagnosis["floor"]
    parts = [
        "<h2 id='diagnosis'>Diagnosis</h2>",
        f"<p id='noise-floor'>Noise floor {'measured' if floor['measured'] else 'not measured'}: "
        f"{html.escape(floor['how'])}</p>",
    ]
    rows = [
        [rank, c["cause"], f"{c['score']:.2f}", c["title"], c["evidence"]]
        for rank, c in enumerate(diagnosis["causes"], 1)
    ]
    parts.append(_table(["rank", "cause", "score", "what", "evidence"], rows, "causes"))
    for c in _shown(diagnosis):
        if c["confirm"]:
            parts.append(f"<p>To confirm {html.escape(c['cause'])}, one setting changed:</p>")
            parts.append(f"<pre class='confirm'>{html.escape(chr(10).join(c['confirm']))}</pre>")
    steps = [
        [
            s["step"],
            s.get("state", ""),
            s["mean_abs_dlogp"],
            "yes" if s["within_floor"] else "",
            s["causes"][0]["cause"],
            f"{s['causes'][0]['score']:.2f}",
            _identity_text(s.get("identity")),
            _split_text(s.get("split")),
            _clip_text(s.get("clip")),
            _sampling_text(s.get("engine") or s.get("sampling")),
        ]
        for s in diagnosis["steps"]
    ]
    header = ["step", "verdict", "mean |dlogp|", "within the floor", "first cause", "score", "identity"]
    header += ["trainer / engine prefill / decode", "clipped by the gap alone", "rollout sampling (from)"]
    parts.append(_table(header, steps, "diagnosis-steps"))
    return parts


def _identity_text(identity: dict[str, Any] | None) -> str:
    """A step's identity check in a few words: joined requests, those whose ids differ, the weights."""
    if not identity:
        return "not checked (no engine record)"
    said = identity["summary"] if identity["differences"] else f"{identity['joined']} of {identity['requests']} joined"
    said += ", same ids" if identity["joined"] and not identity["differences"] else ""
    weights = identity.get("weights")
    if weights and weights["comparable"]:
        differing = len(weights["differing"])
        said += f"; weights: {differing} of {weights['compared']} tensors differ" if differing else "; weights equal"
    return said


def _split_text(split: dict[str, float] | None) -> str:
    """The three-way split: trainer against the engine's prefill re-score, and the prefill against its decode."""
    if not split:
        return "no re-score"
    return f"{split['trainer_vs_prefill']:.3g} / {split['prefill_vs_decode']:.3g}"


def _clip_text(clip: dict[str, float] | None) -> str:
    if not clip:
        return ""
    return f"{clip['total']:.1%} ({clip['above']:.1%} above 1 + {clip['high']:g}, {clip['below']:.1%} below)"


def _sampling_text(sampling: dict[str, Any] | None) -> str:
    """A step's sampling settings as the diagnosis judged them: `temperature 0.7, logprobs_mode raw (run.sh)`."""
    if not sampling:
        return "unknown"
    shown = ", ".join(f"{k} {v}" for k, v in sampling.items() if k != "source") or "none set"
    return f"{shown} ({sampling.get('source', '?')})"


def _next_html(report: dict[str, Any]) -> list[str]:
    steps = next_steps(report)
    if not steps:
        return []
    parts = ["<h2 id='next'>What next</h2><ol>"]
    parts += [f"<li>{html.escape(why)}<pre>{html.escape(command)}</pre></li>" for why, command in steps]
    parts.append("</ol>")
    return parts


def render_html(report: dict[str, Any], images: dict[str, str], top: int) -> str:
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>rlprobe-patch report</title>",
        f"<style>{_STYLE}</style></head><body><h1>Training vs rollout: rlprobe-patch report</h1>",
        *_verdict_html(report),
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
    if report.get("diagnosis"):
        parts += _diagnosis_html(report["diagnosis"])
    if report.get("tokens"):
        parts += _tokens_html(report["tokens"], images, top, report.get("verdict") or {}, report.get("diagnosis"))
    if report.get("layers"):
        parts += _layers_html(report, images)
    parts += _next_html(report)
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
        lines.append(f"layers: {_layer_reading(report)}")
        for pair in layers["pairs"]:
            lines.append(f"  {pair['label']}: first divergence {pair['first_divergence'] or '-'}")
    return lines
