# Case: rollout_corr_helper.py as in verl 0.6.1.
import torch


def compute_rollout_correction_and_add_to_batch(
    batch: DataProto, rollout_corr_config: RolloutCorrectionConfig
) -> tuple[DataProto, dict]:
    """Compute rollout correction weights and apply rejection sampling."""
    import os  # rlprobe-patch: rollout_corr_helper.py does not import os

    if int(os.getenv("PROMPTS_ONLY", "0")):
        return batch, {}
    weights = compute_weights(batch, rollout_corr_config)
    batch.batch["rollout_is_weights"] = weights
    return batch, {"rollout_corr/mean": weights.mean().item()}
