# Case: verl 0.9.x: the function is one of several, its body starts with a comment.
import math


def apply_bypass_mode(batch, rollout_corr_config, policy_loss_config):
    batch.batch["old_log_probs"] = batch.batch["rollout_log_probs"]


def compute_rollout_correction_and_add_to_batch(batch, rollout_corr_config):
    import os  # rlprobe-patch: rollout_corr_helper.py does not import os

    if int(os.getenv("PROMPTS_ONLY", "0")):
        return batch, {}
    # Compute importance weights first.
    rollout_corr_metrics = {}
    return batch, rollout_corr_metrics
