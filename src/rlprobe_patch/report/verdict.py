"""The report's verdict: verl's own guidance on `rollout_probs_diff_mean`, step by step, and what it cannot see.

- verl's guidance (`patches/releases/verl.toml` `[mismatch_guidance]`, from verl's FAQ): each step's
  `training/rollout_probs_diff_mean` (the number verl logs per step) is within it, a warning above 0.005,
  a mismatch above 0.01. The verdict is the worst step's.
- When a step's tokens are so unlikely that the number could not reach verl's fail level whatever the
  mismatch (its ceiling, the mean of max(p_train, p_rollout), below 0.01: a random or untrained model), it
  is uninformative there: the step is graded on its log-probs instead, by NeMo-RL's token multiplicative
  error, mean exp(|dlogp|), against the gate NeMo-RL asserts (`TME_GATE`), and the verdict says so.
- msprobe's layer compare, where given: a pair with a module out of the layer floor is a mismatch, named by the
  first module that leaves it in every disagreeing pair. The diagnosis reads the compare against its floor (the
  pairs msprobe finds within its thresholds and the clean steps' pairs, module by module: in bfloat16 msprobe's
  absolute thresholds flag every pair, the clean run's too); without the diagnosis, msprobe's thresholds decide.

A threshold option (`--max-prob-diff-mean` ...) decides the exit code instead; the verdict is still shown.
"""

from __future__ import annotations

import math
from typing import Any

from rlprobe_patch.catalogue.releases import MismatchGuidance, releases

# NeMo-RL's gate on mean exp(|log p_a - log p_b|) between two computations of the same tokens' log-probs
# (NVIDIA-NeMo/RL, tools/model_diagnostics/2.long_generation_decode_vs_prefill.py: `assert lp_error < 1.05`;
# a healthy engine reads about 1.007 there, the chunked-prefill bug it caught above 300).
TME_GATE = 1.05
TME_SOURCE = "NeMo-RL's decode-vs-prefill check (tools/model_diagnostics/2.long_generation_decode_vs_prefill.py)"

_ORDER = {"ok": 0, "no value": 0, "warn": 1, "fail": 2}
_TOLD = 12  # steps said one by one in the reasons; the others are counted


def figure(value: float) -> str:
    """A figure as the report's texts write it: three significant digits."""
    return f"{value:.3g}"


def grade_step(step: dict[str, Any], guidance: MismatchGuidance) -> dict[str, Any]:
    """One step's state ("ok", "warn", "fail", "no value"), whether verl's number is informative, and why."""
    value = step["metrics"].get(guidance.metric)
    scale = step.get("scale") or {}
    graded: dict[str, Any] = {"step": step["step"], "kind": step["kind"], "value": value, **scale}
    name = f"step {step['step']}: {guidance.metric.split('/')[-1]} "
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return {**graded, "state": "no value", "informative": False, "why": name + "has no token to measure"}
    ceiling, tme = scale["probs_diff_mean_ceiling"], scale["token_multiplicative_error"]
    if ceiling < guidance.fail:
        # |dp| <= max(p_train, p_rollout): no mismatch could push the mean past `ceiling` on these tokens
        state = "fail" if tme > TME_GATE else "ok"
        why = (
            f"{name}{figure(value)} is uninformative here: the tokens are unlikely (median p "
            f"{figure(scale['median_rollout_p'])}), so it could be at most {figure(ceiling)} whatever the mismatch, "
            f"below verl's {guidance.fail}; the log-probs "
            f"say {'mismatch' if state == 'fail' else 'within'}: mean exp(|dlogp|) {figure(tme)} "
            f"{'above' if state == 'fail' else 'within'} NeMo-RL's gate {TME_GATE} (mean |dlogp| "
            f"{figure(scale['mean_abs_dlogp'])}, max {figure(scale['max_abs_dlogp'])})"
        )
        return {**graded, "state": state, "informative": False, "why": why}
    if value > guidance.fail:
        state, why = "fail", f"{name}{figure(value)} above verl's {guidance.fail}: a precision issue by verl's guidance"
    elif value > guidance.warn:
        state = "warn"
        why = f"{name}{figure(value)} above verl's warning level {guidance.warn} (mismatch above {guidance.fail})"
    else:
        state, why = "ok", f"{name}{figure(value)} within verl's {guidance.warn}"
    if state == "ok" and tme > TME_GATE:
        state = "warn"
        why += f"; but mean exp(|dlogp|) {figure(tme)} is above NeMo-RL's gate {TME_GATE}: look at the worst tokens"
    return {**graded, "state": state, "informative": True, "why": why}


def _guidance() -> MismatchGuidance:
    guidance = releases("verl").guidance
    assert guidance is not None, "patches/releases/verl.toml lacks [mismatch_guidance]"
    return guidance


def grade_steps(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Each step of the report's tokens (in the inputs' order) graded by verl's guidance alone."""
    guidance = _guidance()
    return [grade_step(s, guidance) for s in (report["tokens"]["steps"] if report.get("tokens") else [])]


def guidance_state(step: dict[str, Any]) -> str:
    """One step's state by verl's guidance alone (its `grade_step`), from its figures (`token_report`'s step)."""
    return str(grade_step(step, _guidance())["state"])


def _with_diagnosis(steps: list[dict[str, Any]], diagnosis: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The guidance's grades made the diagnosis' where it judged the step (`state`): within the measured noise floor
    a step is ok, out of it at least a warning, one whose tokens differ a failure; the two never disagree."""
    judged = {s["batch"]: s for s in (diagnosis or {}).get("steps", []) if "batch" in s}
    merged = []
    for index, grade in enumerate(steps):
        step = judged.get(index)
        if step is None or step["state"] == grade["state"]:
            merged.append(grade)
            continue
        top = step["causes"][0]
        if step["state"] == "ok":
            why = f"within the measured noise floor (mean |dlogp| {figure(step['mean_abs_dlogp'])}): precision noise"
        else:
            why = f"the diagnosis ranks {top['cause']} first ({top['title']}, score {figure(top['score'])})"
        merged.append(
            {**grade, "state": step["state"], "guidance_state": grade["state"], "why": f"{grade['why']}; but {why}"}
        )
    return merged


def verdict(report: dict[str, Any], grades: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The report's verdict: the worst of its steps' grades (verl's guidance, the diagnosis' where it judged the
    step) and of the layer compare."""
    guidance = releases("verl").guidance
    assert guidance is not None, "patches/releases/verl.toml lacks [mismatch_guidance]"
    steps = _with_diagnosis(grades if grades is not None else grade_steps(report), report.get("diagnosis"))
    plain = [s for s in steps if s["state"] == "ok" and s["informative"] and "guidance_state" not in s]
    told = [s for s in steps if s not in plain]  # said one by one: warnings, mismatches, uninformative steps
    reasons = [s["why"] for s in told[:_TOLD]]
    if len(told) > _TOLD:
        reasons.append(f"... and {len(told) - _TOLD} more step(s) like these (report.json: verdict.steps)")
    if plain:
        largest = max(plain, key=lambda s: s["value"])
        reasons.insert(
            0,
            f"{len(plain)} step(s) within verl's {guidance.warn} (largest {guidance.metric.split('/')[-1]} "
            f"{figure(largest['value'])}, step {largest['step']})",
        )
    states = [s["state"] for s in steps]
    layers = report.get("layers")
    view = (report.get("diagnosis") or {}).get("layers")
    if view:  # the diagnosis read the compare against its own floor: msprobe's flags on float rounding are noise
        disagreeing, pairs = len(view["disagreeing"]), view["pairs"]
        flagged = set((layers or {}).get("disagreeing_pairs", []))
        clean = [label for label in view.get("reference", []) if label in flagged]
        said = []
        if view["within_floor"]:
            said.append(f"{len(view['within_floor'])} flagged by msprobe within the layer floor")
        if clean:  # in bfloat16 msprobe's absolute thresholds flag the clean run's pairs too: they are the floor
            said.append(f"{len(clean)} of them the clean step(s)' pairs, the floor itself")
        noise = f" ({'; '.join(said)})" if said else ""
        if disagreeing:
            states.append("fail")
            reasons.append(
                f"layer compare: {disagreeing} of {pairs} pair(s) leave the layer floor{noise}; first module to "
                f"diverge in every one: {view['first_common'] or '(none in common)'}"
            )
        else:
            states.append("ok")
            reasons.append(f"layer compare: all {pairs} pair(s) within the layer floor{noise}")
    elif layers:
        disagreeing, pairs = len(layers["disagreeing_pairs"]), len(layers["pairs"])
        if disagreeing:
            states.append("fail")
            reasons.append(
                f"layer compare: {disagreeing} of {pairs} pair(s) leave msprobe's thresholds; first module to diverge "
                f"in every one: {layers['first_common_divergence'] or '(none in common)'}"
            )
        else:
            states.append("ok")
            reasons.append(f"layer compare: all {pairs} pair(s) within msprobe's thresholds")
    state = max(states, key=_ORDER.__getitem__) if states else "no value"
    return {
        "state": state,
        "metric": guidance.metric,
        "warn": guidance.warn,
        "fail": guidance.fail,
        "source": guidance.source,
        "log_prob_gate": {"token_multiplicative_error": TME_GATE, "source": TME_SOURCE},
        "steps": steps,
        "reasons": reasons,
    }
