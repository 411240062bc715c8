"""Anchors of `verl.prompts-only`.

- `RayPPOTrainer.fit` (V0 trainer, every release 0.6.0 to 0.9.1): the one
  `with marked_timer("old_log_prob", ...)` block, wherever it is nested (inline in `fit` up to
  0.6.0, in the recompute branch of `if bypass_recomputing_logprobs:` from 0.6.1, around
  `self._compute_old_log_prob(batch)` from 0.7.0). Trimming right before it covers all three.
- `FullyAsyncTrainer._fit_generate` (0.8.0+, when the experimental fully-async policy is
  installed): right before `batch.meta_info["temperature"] = ...`.
- `PPOTrainer._step_once` (the V1 trainer, default from 0.9.0): the same old-log-prob block, in
  the method's own body, after `_balance_batch`; the batch there is a `KVBatchMeta`.
- `SeparateRayPPOTrainer._fit_compute_log_prob` (0.7.1+, experimental): the same block, in the
  recompute branch. `OneStepOffRayTrainer` (0.8.0+) inherits this method unchanged, so this one
  site trims its batches too, after `_fit_compute_reward` as in V0 (its `_fit_generate` runs
  before the reward, which needs the responses). The fully-async trainer, trimmed already in
  `_fit_generate`, passes here too; a second trim finds no response columns and changes nothing.
"""

import libcst as cst
import libcst.matchers as m

from rlprobe_patch.codemod import ANY, METHOD, AddMethods, Hook, PatchCodemod, Where

OLD_LOG_PROB_TIMER = m.Call(func=m.Name("marked_timer"), args=[m.Arg(m.SimpleString('"old_log_prob"')), m.ZeroOrMore()])

OLD_LOG_PROB_BLOCK = m.With(items=[m.WithItem(item=OLD_LOG_PROB_TIMER), m.ZeroOrMore()])


def is_old_log_prob_block(stmt: cst.BaseStatement) -> bool:
    return m.matches(stmt, OLD_LOG_PROB_BLOCK)


def sets_temperature(stmt: cst.BaseStatement) -> bool:
    target = m.Subscript(
        value=m.Attribute(value=m.Name("batch"), attr=m.Name("meta_info")),
        slice=[m.SubscriptElement(m.Index(m.SimpleString('"temperature"')))],
    )
    return m.matches(stmt, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target)])]))


class RayTrainer(PatchCodemod):
    DESCRIPTION = "PROMPTS_ONLY trimming before RayPPOTrainer.fit's old-log-prob pass"
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


class V1Trainer(PatchCodemod):
    DESCRIPTION = "PROMPTS_ONLY trimming of the TransferQueue rows before PPOTrainer._step_once's old-log-prob pass"
    REQUIRES_MODULE_NAMES = ("tq", "tu")
    OPERATIONS = (
        AddMethods("PPOTrainer"),
        Hook(
            "PPOTrainer",
            "_step_once",
            "trim_kv_batch_before_old_log_prob",
            Where.BEFORE,
            METHOD,
            anchor=is_old_log_prob_block,
            expected='`with marked_timer("old_log_prob", ...):` block in the method body',
        ),
    )


class SeparateTrainer(PatchCodemod):
    DESCRIPTION = "PROMPTS_ONLY trimming before SeparateRayPPOTrainer._fit_compute_log_prob's old-log-prob pass"
    OPERATIONS = (
        AddMethods("SeparateRayPPOTrainer", payload_cls="RayPPOTrainer"),
        Hook(
            "SeparateRayPPOTrainer",
            "_fit_compute_log_prob",
            "trim_before_separate_old_log_prob",
            Where.BEFORE,
            ANY,
            anchor=is_old_log_prob_block,
            expected='`with marked_timer("old_log_prob", ...):` block',
        ),
    )
