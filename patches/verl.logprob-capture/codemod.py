"""Anchors of `verl.logprob-capture`: where verl computes its own rollout-vs-training debug metrics.

- `RayPPOTrainer.fit` (V0 trainer, every release 0.6.0 to 0.9.1): the one
  `if "rollout_log_probs" in batch.batch.keys():` statement whose body calls
  `calculate_debug_metrics(batch)`, wherever it is nested (inside the
  `with marked_timer("old_log_prob", ...)` block; in the recompute branch from 0.6.1). The
  capture goes right after it, so that it runs whether the batch holds rollout log-probs or not
  (and refuses when not); the precondition (bypass mode, `calculate_log_probs`) at the top of
  `fit`, before the first step.
- `SeparateRayPPOTrainer._fit_compute_log_prob` (0.7.1+, experimental; `OneStepOffRayTrainer`
  and `FullyAsyncTrainer` inherit it): the same `if` statement; the precondition at the top of the
  method, before its bypass branch.
- `PPOTrainer._compute_old_log_prob` (the V1 trainer, 0.9.0+): the
  `if self.config.actor_rollout_ref.rollout.calculate_log_probs:` statement whose body calls
  `calculate_debug_metrics(data)`; the precondition at the top of the method.
"""

import libcst as cst
import libcst.matchers as m

from rlprobe_patch.codemod import ANY, METHOD, AddDefinitions, Hook, PatchCodemod, Where, contains

DEBUG_METRICS_CALL = m.Call(func=m.Name("calculate_debug_metrics"))


def computes_debug_metrics(stmt: cst.BaseStatement) -> bool:
    """An `if` whose own body (not a nested block, not its `else`) calls `calculate_debug_metrics`."""
    if not isinstance(stmt, cst.If) or not isinstance(stmt.body, cst.IndentedBlock):
        return False
    return any(isinstance(s, cst.SimpleStatementLine) and contains(s, DEBUG_METRICS_CALL) for s in stmt.body.body)


EXPECTED = "`if ...:` statement whose body calls `calculate_debug_metrics(...)`"


class RayTrainer(PatchCodemod):
    DESCRIPTION = "RayPPOTrainer.fit writes one log-prob capture per step where it computes its debug metrics"
    OPERATIONS = (
        AddDefinitions(("_RlprobeLogprobCapture",)),
        Hook("RayPPOTrainer", "fit", "check_capture_before_fit", Where.START, METHOD, expected="the body"),
        Hook(
            "RayPPOTrainer",
            "fit",
            "capture_after_debug_metrics",
            Where.AFTER,
            ANY,
            anchor=computes_debug_metrics,
            expected=EXPECTED,
        ),
    )


class SeparateTrainer(PatchCodemod):
    DESCRIPTION = (
        "SeparateRayPPOTrainer._fit_compute_log_prob writes one log-prob capture per step where it computes "
        "its debug metrics"
    )
    OPERATIONS = (
        AddDefinitions(("_RlprobeLogprobCapture",)),
        Hook(
            "SeparateRayPPOTrainer",
            "_fit_compute_log_prob",
            "check_capture_before_log_prob",
            Where.START,
            METHOD,
            expected="the body",
        ),
        Hook(
            "SeparateRayPPOTrainer",
            "_fit_compute_log_prob",
            "capture_after_debug_metrics",
            Where.AFTER,
            ANY,
            anchor=computes_debug_metrics,
            expected=EXPECTED,
        ),
    )


class V1Trainer(PatchCodemod):
    DESCRIPTION = (
        "PPOTrainer._compute_old_log_prob (V1) writes one log-prob capture per step where it computes its debug metrics"
    )
    OPERATIONS = (
        AddDefinitions(("_RlprobeLogprobCapture",)),
        Hook(
            "PPOTrainer",
            "_compute_old_log_prob",
            "check_capture_before_log_prob",
            Where.START,
            METHOD,
            expected="the body",
        ),
        Hook(
            "PPOTrainer",
            "_compute_old_log_prob",
            "capture_after_kv_debug_metrics",
            Where.AFTER,
            METHOD,
            anchor=computes_debug_metrics,
            expected=EXPECTED + " in the method body",
        ),
    )
