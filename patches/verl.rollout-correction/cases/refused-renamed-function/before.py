# Case (refused): verl 0.9.x's compute_rollout_correction_and_add_to_batch, renamed.
import math


def apply_bypass_mode(batch, rollout_corr_config, policy_loss_config):
    batch.batch["old_log_probs"] = batch.batch["rollout_log_probs"]


def compute_rollout_correction_and_add_to_batch_renamed(batch, rollout_corr_config):
    # Compute importance weights first.
    rollout_corr_metrics = {}
    return batch, rollout_corr_metrics
