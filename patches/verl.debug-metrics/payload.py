"""What `verl.debug-metrics` inserts at the top of `calculate_debug_metrics` (verl/utils/debug/metrics.py).

Under PROMPTS_ONLY the batch has no response columns, and the rollout-vs-actor metrics would
fail on width-0 tensors: return them zeroed instead. `PROMPTS_ONLY` is read by the shared switch
reader, appended to metrics.py as the class `_RlprobeSwitches` (the hook is a module-level
function: there is no class of ours to add the methods to). The skill's checker looks for
`PROMPTS_ONLY` and "skipping debug metrics".
"""

import logging

from _shared.switches import Switches

logger = logging.getLogger(__file__)  # metrics.py defines it


def skip_without_responses(data):
    """First statements of `calculate_debug_metrics` (after its docstring)."""
    if (
        _RlprobeSwitches()._rlprobe_run_switches()["prompts_only"]  # rlprobe-patch: PROMPTS_ONLY
        or "responses" not in data.batch.keys()
        or data.batch["responses"].numel() == 0
    ):
        logger.info("PROMPTS_ONLY or no responses: skipping debug metrics")
        return {
            "training/rollout_probs_diff_valid": 0,
            "training/rollout_probs_diff_max": 0.0,
            "training/rollout_probs_diff_mean": 0.0,
            "training/rollout_probs_diff_std": 0.0,
            "training/rollout_actor_probs_pearson_corr": 0.0,
        }


class _RlprobeSwitches:
    # Added by rlprobe-patch (verl.debug-metrics); `rlprobe-patch revert` removes it.
    # The switch reader (patches/_shared/switches.py) for the hook at the top of
    # `calculate_debug_metrics`, a module-level function.
    _rlprobe_on_rank = Switches._rlprobe_on_rank
    _rlprobe_switch = Switches._rlprobe_switch
    _rlprobe_switches = Switches._rlprobe_switches
    _rlprobe_run_switches = Switches._rlprobe_run_switches
