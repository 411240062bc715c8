"""The report as the command prints it (`summary_lines`, `diagnosis_lines`), and the readings the page shares with
it (the layer compare in one sentence, the causes shown first)."""

from __future__ import annotations

import math
from typing import Any


def number(value: Any) -> str:
    """A value as the summary and the page write it: "-" for none, six significant digits for a float."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.6g}"
    return str(value)


def layer_disagreeing(report: dict[str, Any]) -> list[str]:
    """The pairs out of the layer floor as the diagnosis read them, else those msprobe's thresholds flag."""
    view = (report.get("diagnosis") or {}).get("layers")
    return list(view["disagreeing"]) if view else list((report.get("layers") or {}).get("disagreeing_pairs", []))


def layer_reading(report: dict[str, Any]) -> str:
    """One sentence on the layer compare: against its floor where the diagnosis read it, msprobe's own count."""
    layers = report["layers"]
    view = (report.get("diagnosis") or {}).get("layers")
    flagged = f"msprobe's thresholds flag {len(layers['disagreeing_pairs'])} of {len(layers['pairs'])} pair(s)"
    if not view:
        common = number(layers["first_common_divergence"])
        return f"first divergence common to every disagreeing pair: {common} ({flagged})"
    noise = f", {len(view['within_floor'])} of them within the floor (float rounding)" if view["within_floor"] else ""
    return (
        f"first module out of the layer floor common to every pair that leaves it: {number(view['first_common'])} "
        f"({len(view['disagreeing'])} of {view['pairs']} pair(s) out of the floor; {flagged}{noise})"
    )


_SHOWN_CAUSES = 3  # the causes the summary and the page name first; report.json holds them all


def shown_causes(diagnosis: dict[str, Any]) -> list[dict[str, Any]]:
    """The first causes of the run's ranking, those with a score."""
    return [c for c in diagnosis["causes"][:_SHOWN_CAUSES] if round(c["score"], 2) > 0] or diagnosis["causes"][:1]


def step_tops(diagnosis: dict[str, Any]) -> str:
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
    for rank, c in enumerate(shown_causes(diagnosis), start=1):
        lines.append(f"  {rank}. {c['cause']} ({c['score']:.2f}): {c['title']}; {c['evidence']}")
        lines += [f"     confirm: {line}" for line in c["confirm"]]
    lines.append(f"  {step_tops(diagnosis)}")
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


def summary_lines(report: dict[str, Any], top: int) -> list[str]:
    lines = []
    tokens = report.get("tokens")
    if tokens:
        o = tokens["overall"]
        lines.append(
            f"tokens: {tokens['samples']} request(s), {tokens['tokens']} token(s) in {len(tokens['steps'])} step(s)"
        )
        lines.append(
            f"  probs diff max {number(o.get('training/rollout_probs_diff_max'))}, "
            f"mean {number(o.get('training/rollout_probs_diff_mean'))}; kl {number(o.get('kl'))}, "
            f"k3_kl {number(o.get('k3_kl'))}; pearson {number(o.get('training/rollout_actor_probs_pearson_corr'))}"
        )
        for r in [r for r in tokens["requests"] if r["tokens"]][:top]:
            w = r["worst_token"]
            lines.append(
                f"  #{r['rank']} {r['request_id']} (step {r['step']}): max |dp| {number(r['max_abs_dp'])}, "
                f"max |dlogp| {number(r['max_abs_dlogp'])} at position {w['position']} (token {w['token_id']})"
            )
    layers = report.get("layers")
    if layers:
        lines.append(f"layers: {layer_reading(report)}")
        for pair in layers["pairs"]:
            lines.append(f"  {pair['label']}: first divergence {pair['first_divergence'] or '-'}")
    return lines
