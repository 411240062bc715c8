# Case (refused): verl 0.6.x's calculate_debug_metrics, renamed.
import logging

import torch

logger = logging.getLogger(__file__)


def calculate_debug_metrics_renamed(data) -> dict:
    """Rollout-vs-actor log-prob metrics."""
    rollout_old_log_probs = data.batch["rollout_log_probs"]
    actor_old_log_probs = data.batch["old_log_probs"]
    diff = torch.abs(rollout_old_log_probs - actor_old_log_probs)
    return {"training/rollout_probs_diff_valid": 1, "training/rollout_probs_diff_max": torch.max(diff).item()}
