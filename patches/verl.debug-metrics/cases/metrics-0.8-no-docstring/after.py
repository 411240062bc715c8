# Case: 0.8.0 adds an early return for an all-False mask; here without a docstring, tabs.
import logging

import torch

logger = logging.getLogger(__file__)


def calculate_debug_metrics(data) -> dict:
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
	mask = data.batch["response_mask"].bool()
	if not mask.any():
		return {"training/rollout_probs_diff_valid": 0}
	return {"training/rollout_probs_diff_valid": 1}
