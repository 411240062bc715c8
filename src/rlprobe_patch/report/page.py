"""report.html: one self-contained page (plots as inline SVG, no script, no link out), by a Jinja2 template
(`templates/report.html`) with autoescape: every value the report holds is escaped on its way into the page (a
request id, a prompt, a module name, a path), the plots' SVG and the tables' cells alone come in as markup.

The values are escaped as `html.escape` does (quotes as `&quot;` and `&#x27;`), the page's text as it was before the
template (the same bytes; tests/runtime/test_report_runtime.py reads the page in a browser).
"""

from __future__ import annotations

import functools
import html
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup

from rlprobe_patch.report.next_steps import next_steps
from rlprobe_patch.report.summary import layer_disagreeing, layer_reading, number, shown_causes

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


@dataclass(frozen=True)
class State:
    """A state word in a cell, coloured by its class (`ok`, `warn`, `fail`)."""

    text: str
    css: str


@dataclass(frozen=True)
class RequestId:
    """A request id in a cell of its own, in full (never cut)."""

    text: str


@dataclass(frozen=True)
class Cell:
    kind: str  # "state", "id", "text" (read from the left) or "number" (lined up on the right)
    text: str
    css: str = ""


@dataclass(frozen=True)
class Table:
    headers: list[str]
    rows: list[list[Cell]]
    css: str = ""


def _cell(value: Any) -> Cell:
    if isinstance(value, State):
        return Cell("state", value.text, value.css)
    if isinstance(value, RequestId):
        return Cell("id", value.text)
    if isinstance(value, str):  # words read from the left; numbers line up on the right
        return Cell("text", value)
    return Cell("number", number(value))


def _table(headers: list[str], rows: list[list[Any]], css: str = "") -> Table:
    return Table(headers, [[_cell(v) for v in row] for row in rows], css)


def _escaped(value: Any) -> Any:
    """Every value printed into the page, escaped as `html.escape` does (markup passes as it is)."""
    return value if isinstance(value, Markup) else Markup(html.escape(str(value)))


def _wbr(text: str) -> Markup:
    """verl's long metric names may break after an underscore: a table as wide as the page, not wider."""
    return Markup(html.escape(text).replace("_", "_<wbr>"))


@functools.cache
def _template() -> Any:
    environment = Environment(
        loader=FileSystemLoader(Path(__file__).with_name("templates")),
        autoescape=True,
        finalize=_escaped,
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=StrictUndefined,
    )
    environment.filters["wbr"] = _wbr
    return environment.get_template("report.html")


def render_html(report: dict[str, Any], images: dict[str, str], top: int) -> str:
    """report.html of `report` (its document), with `images` (name -> inline SVG) and its `top` worst requests."""
    diagnosis = report.get("diagnosis")
    return str(
        _template().render(
            style=Markup(_STYLE),
            images={name: Markup(svg) for name, svg in images.items()},
            verdict=_verdict(report),
            thresholds=[_threshold(c) for c in report.get("thresholds") or []],
            diagnosis=_diagnosis(diagnosis) if diagnosis else None,
            tokens=_tokens(report["tokens"], top, report.get("verdict") or {}, diagnosis)
            if report.get("tokens")
            else None,
            layers=_layers(report) if report.get("layers") else None,
            next=next_steps(report),
        )
    )


def _verdict(report: dict[str, Any]) -> dict[str, Any] | None:
    judged = report.get("verdict")
    if not judged:
        return None
    state = judged["state"]
    sources = [f"step {s['step']}" for s in judged["steps"] if s["state"] == state]
    layers = report.get("layers")
    out_of_floor = layer_disagreeing(report)
    if layers and out_of_floor and state == "fail":
        sources.append(f"the layer compare ({len(out_of_floor)} of {len(layers['pairs'])} pairs)")
    diagnosis = report.get("diagnosis")
    top = None
    if diagnosis and diagnosis.get("causes") and diagnosis.get("steps"):
        cause = diagnosis["causes"][0]
        top = {**cause, "score": f"{cause['score']:.2f}"}
    return {
        "state": state.upper(),
        "css": state if state in ("ok", "warn", "fail") else "",
        "sources": ", ".join(sources) if state in ("warn", "fail") else "",
        "metric": judged["metric"],
        "warn": judged["warn"],
        "fail": judged["fail"],
        "source": judged["source"],
        "gate": judged["log_prob_gate"]["token_multiplicative_error"],
        "gate_source": judged["log_prob_gate"]["source"],
        "decides_exit": judged.get("decides_exit", True),
        "reasons": judged["reasons"],
        "top": top,
    }


def _threshold(c: dict[str, Any]) -> dict[str, Any]:
    state = "no value" if c["crossed"] is None else ("CROSSED" if c["crossed"] else "within")
    css = "crossed" if c["crossed"] else "ok"
    return {"css": css, "option": c["option"], "limit": c["limit"], "metric": c["metric"], "value": number(c["value"]),
            "state": state}  # fmt: skip


def _floor_state(step: dict[str, Any] | None, floor: dict[str, Any]) -> State | None:
    """A step against the diagnosis's noise floor: within, or out and how far (its mean |dlogp| over the limit)."""
    if step is None:
        return None
    if step["within_floor"]:
        return State("within", "ok")
    return State(f"out, {step['mean_abs_dlogp'] / floor['mean_limit']:.3g}x", "fail")


def _tokens(
    tokens: dict[str, Any], top: int, verdict: dict[str, Any], diagnosis: dict[str, Any] | None
) -> dict[str, Any]:
    graded = {(s["step"], s["kind"]): s for s in verdict.get("steps", [])}
    # each step against the noise floor too: verl's number can grade every step ok under a FAIL that the layer
    # compare or the log-probs found (a stale rollout: its steps ok by verl's number, out of the measured floor)
    judged = {(s["step"], s["kind"]): s for s in (diagnosis or {}).get("steps", [])}
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
                State(g["state"], g["state"]) if g.get("state") else None,
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
    worst = _worst(tokens, top)
    filled = [r for r in tokens["by_probability_decade"] if r["tokens"]]
    decade_rows = [
        [f"{r['p_from']:.0e}-{r['p_to']:.0e}", r["tokens"], r["mean_abs_dlogp"], r["mean_abs_dp"]] for r in filled
    ]
    one = filled[0] if len(filled) == 1 else None
    return {
        "samples": tokens["samples"],
        "tokens": tokens["tokens"],
        "empty": tokens["empty_responses"],
        "step_count": len(tokens["steps"]),
        "steps": _table(headers, rows, "steps"),
        "overall": _table(["metric", "value"], [[k, v] for k, v in tokens["overall"].items()], "metrics"),
        "worst_count": len(worst.rows),
        "worst": worst,
        "one_decade": {"tokens": one["tokens"], "p_from": f"{one['p_from']:.0e}", "p_to": f"{one['p_to']:.0e}"}
        if one
        else None,
        "decades": _table(["rollout p", "tokens", "mean |dlogp|", "mean |dp|"], decade_rows, "by-decade"),
    }


def _worst(tokens: dict[str, Any], top: int) -> Table:
    """The `top` worst requests, each once, at its worst step (a run that replays the same requests step after step
    has them in every step), with the steps it is among the worst in."""
    steps_of: dict[str, list[Any]] = {}
    worst: list[dict[str, Any]] = []
    for r in (r for r in tokens["requests"] if r["tokens"]):
        if r["request_id"] not in steps_of:
            if len(worst) == top:
                continue
            worst.append(r)
        steps_of.setdefault(r["request_id"], []).append(r["step"])
    rows = []
    for r in worst:
        w = r["worst_token"]
        also = [s for s in steps_of[r["request_id"]] if s != r["step"]]
        rows.append(
            [
                r["rank"],
                RequestId(r["request_id"]),
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
    return _table(headers, rows, "worst-requests")


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


def _layers(report: dict[str, Any]) -> dict[str, Any]:
    pairs = []
    for pair in sorted(report["layers"]["pairs"], key=lambda p: p["first_divergence"] is None):
        tensor = pair["mode"] == "tensor"
        headers = ["#", "module", *(["cosine", "max abs err"] if tensor else ["|max diff|"]), "msprobe's thresholds"]
        rows = [
            [i, m["module"], *([m["cosine"], m["max_abs_err"]] if tensor else [m["max_diff"]]), _module_state(m)]
            for i, m in enumerate(pair["modules"], start=1)
        ]
        pairs.append(
            {
                "heading": pair.get("heading") or pair["pair"],
                "first": number(pair["first_divergence"]),
                "path": pair["path"],
                "agrees": pair["first_divergence"] is None,
                "table": _table(headers, rows, "modules"),
            }
        )
    return {"reading": layer_reading(report), "pairs": pairs}


def _diagnosis(diagnosis: dict[str, Any]) -> dict[str, Any]:
    causes = [
        [rank, c["cause"], f"{c['score']:.2f}", c["title"], c["evidence"]]
        for rank, c in enumerate(diagnosis["causes"], 1)
    ]
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
    floor = diagnosis["floor"]
    return {
        "measured": "measured" if floor["measured"] else "not measured",
        "how": floor["how"],
        "causes": _table(["rank", "cause", "score", "what", "evidence"], causes, "causes"),
        "confirms": [
            {"cause": c["cause"], "lines": "\n".join(c["confirm"])} for c in shown_causes(diagnosis) if c["confirm"]
        ],
        "steps": _table(header, steps, "diagnosis-steps"),
    }


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
