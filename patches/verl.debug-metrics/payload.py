"""What `verl.debug-metrics` inserts at the top of `calculate_debug_metrics` (verl/utils/debug/metrics.py).

Under PROMPTS_ONLY the batch has no response columns, and the rollout-vs-actor metrics would
fail on width-0 tensors: return them zeroed instead. The skill's checker looks for
`PROMPTS_ONLY` and "skipping debug metrics".
"""

import logging

logger = logging.getLogger(__file__)  # metrics.py defines it


def skip_without_responses(data):
    """First statements of `calculate_debug_metrics` (after its docstring)."""
    import os  # rlprobe-patch: metrics.py does not import os

    if (
        int(os.getenv("PROMPTS_ONLY", "0"))
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
