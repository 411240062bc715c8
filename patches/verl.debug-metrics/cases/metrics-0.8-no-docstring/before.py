# Case: 0.8.0 adds an early return for an all-False mask; here without a docstring, tabs.
import logging

import torch

logger = logging.getLogger(__file__)


def calculate_debug_metrics(data) -> dict:
	mask = data.batch["response_mask"].bool()
	if not mask.any():
		return {"training/rollout_probs_diff_valid": 0}
	return {"training/rollout_probs_diff_valid": 1}
