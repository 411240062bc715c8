"""Anchors of `verl.prompts-only`.

- `RayPPOTrainer.fit` (V0 trainer, every release 0.6.0 to 0.9.1): the one
  `with marked_timer("old_log_prob", ...)` block, wherever it is nested (inline in `fit` up to
  0.6.0, in the recompute branch of `if bypass_recomputing_logprobs:` from 0.6.1, around
  `self._compute_old_log_prob(batch)` from 0.7.0). Trimming right before it covers all three.
- `FullyAsyncTrainer._fit_generate` (0.8.0+, when the experimental fully-async policy is
  installed): right before `batch.meta_info["temperature"] = ...`.
"""

import libcst as cst
import libcst.matchers as m

from rlprobe_patch.codemod import ANY, METHOD, AddMethods, Hook, PatchCodemod, Where

OLD_LOG_PROB_TIMER = m.Call(func=m.Name("marked_timer"), args=[m.Arg(m.SimpleString('"old_log_prob"')), m.ZeroOrMore()])


def is_old_log_prob_block(stmt: cst.BaseStatement) -> bool:
    return m.matches(stmt, m.With(items=[m.WithItem(item=OLD_LOG_PROB_TIMER), m.ZeroOrMore()]))


def sets_temperature(stmt: cst.BaseStatement) -> bool:
    target = m.Subscript(
        value=m.Attribute(value=m.Name("batch"), attr=m.Name("meta_info")),
        slice=[m.SubscriptElement(m.Index(m.SimpleString('"temperature"')))],
    )
    return m.matches(stmt, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target)])]))


class RayTrainer(PatchCodemod):
    DESCRIPTION = "PROMPTS_ONLY trimming before RayPPOTrainer.fit's old-log-prob pass"
    REQUIRES_MODULE_NAMES = ("os",)
    OPERATIONS = (
        AddMethods("RayPPOTrainer"),
        Hook(
            "RayPPOTrainer",
            "fit",
            "trim_before_old_log_prob",
            Where.BEFORE,
            ANY,
            anchor=is_old_log_prob_block,
            expected='`with marked_timer("old_log_prob", ...):` block',
        ),
    )


class FullyAsyncTrainer(PatchCodemod):
    DESCRIPTION = "PROMPTS_ONLY trimming of the samples FullyAsyncTrainer._fit_generate takes"
    REQUIRES_MODULE_NAMES = ("os",)
    OPERATIONS = (
        AddMethods("FullyAsyncTrainer", payload_cls="RayPPOTrainer"),
        Hook(
            "FullyAsyncTrainer",
            "_fit_generate",
            "trim_after_samples",
            Where.BEFORE,
            METHOD,
            anchor=sets_temperature,
            expected='`batch.meta_info["temperature"] = ...` in the method body',
        ),
    )
