"""report.html: one self-contained page (plots as base64 PNG, no script, no link out) and the text summary."""

from __future__ import annotations

import base64
import html
import io
import math
from typing import Any

import numpy as np


def _png(fig: Any) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def plots(report: dict[str, Any], dlogp: Any) -> dict[str, str]:
    """name -> base64 PNG; matplotlib (the `report` extra) with its Agg backend, no display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out: dict[str, str] = {}
    tokens = report.get("tokens")
    if tokens and tokens["tokens"]:
        fig, ax = plt.subplots(figsize=(6, 3.2))
        values = np.asarray(dlogp)
        positive = values[values > 0]
        if positive.size:
            low = max(float(positive.min()), 1e-12)
            bins = np.logspace(math.log10(low), math.log10(float(positive.max()) * 1.0001 + 1e-300), 50)
            ax.hist(positive, bins=bins.tolist(), color="#3b6ea8")
            ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("|log p_train - log p_rollout| per token")
        ax.set_ylabel("tokens")
        ax.set_title(f"{values.size} tokens, {int((values == 0).sum())} identical")
        out["histogram"] = _png(fig)
        plt.close(fig)
        rows = tokens["by_position"]
        fig, ax = plt.subplots(figsize=(6, 3.2))
        centres = [(r["first"] + r["last"]) / 2 for r in rows]
        ax.plot(centres, [r["mean_abs_dlogp"] for r in rows], marker="o", label="mean |dlogp|")
        ax.plot(centres, [r["mean_abs_dp"] for r in rows], marker="s", label="mean |dp|")
        ax.set_xlabel("position in the response")
        ax.set_ylabel("mean difference")
        ax.legend()
        out["by_position"] = _png(fig)
        plt.close(fig)
        rows = tokens["by_probability"]
        fig, ax = plt.subplots(figsize=(6, 3.2))
        labels = [f"{r['p_from']:.1f}-{r['p_to']:.1f}" for r in rows]
        ax.bar(labels, [r["mean_abs_dlogp"] or 0.0 for r in rows], color="#a85a3b")
        ax.set_xlabel("rollout probability of the token")
        ax.set_ylabel("mean |dlogp|")
        ax.tick_params(axis="x", labelrotation=45)
        out["by_probability"] = _png(fig)
        plt.close(fig)
    layers = report.get("layers")
    if layers and layers["pairs"]:
        fig, ax = plt.subplots(figsize=(7, 3.6))
        for pair in layers["pairs"][:12]:
            modules = pair["modules"]
            ys = [m["cosine"] if pair["mode"] == "tensor" else m["max_diff"] for m in modules]
            ax.plot(range(len(modules)), [np.nan if y is None else y for y in ys], marker=".", label=pair["pair"])
            first = next((i for i, m in enumerate(modules) if m["diverges"]), None)
            if first is not None:
                ax.axvline(first, linestyle="--", color="red", alpha=0.5)
        mode = layers["pairs"][0]["mode"]
        ax.set_xlabel("module, in forward order")
        ax.set_ylabel("cosine" if mode == "tensor" else "|max diff|")
        ax.set_title("layer divergence (dashed: first module out of msprobe's thresholds)")
        ax.legend(fontsize=7)
        out["layers"] = _png(fig)
        plt.close(fig)
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
        f'<figure id="plot-{name}"><img alt="{html.escape(alt)}" src="data:image/png;base64,{images[name]}"></figure>'
    )


_STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.85em; }
th, td { border: 1px solid #bbb; padding: 2px 6px; text-align: right; }
th { background: #eee; } td:first-child { text-align: left; }
.crossed { color: #b00; font-weight: bold; } .ok { color: #070; }
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
