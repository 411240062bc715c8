# Case: calculate_debug_metrics as in verl 0.6.x.
import logging

import torch

logger = logging.getLogger(__file__)


def calculate_debug_metrics(data) -> dict:
    """Rollout-vs-actor log-prob metrics."""
    rollout_old_log_probs = data.batch["rollout_log_probs"]
    actor_old_log_probs = data.batch["old_log_probs"]
    diff = torch.abs(rollout_old_log_probs - actor_old_log_probs)
    return {"training/rollout_probs_diff_valid": 1, "training/rollout_probs_diff_max": torch.max(diff).item()}
