# Case: calculate_debug_metrics as in verl 0.6.x.
import logging

import torch

logger = logging.getLogger(__file__)


def calculate_debug_metrics(data) -> dict:
    """Rollout-vs-actor log-prob metrics."""
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
    rollout_old_log_probs = data.batch["rollout_log_probs"]
    actor_old_log_probs = data.batch["old_log_probs"]
    diff = torch.abs(rollout_old_log_probs - actor_old_log_probs)
    return {"training/rollout_probs_diff_valid": 1, "training/rollout_probs_diff_max": torch.max(diff).item()}
