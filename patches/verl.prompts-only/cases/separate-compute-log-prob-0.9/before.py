# Case: the experimental separated trainer (0.7.1+; one-step-off inherits it) has its own
# old-log-prob step, in the recompute branch; its module does not import os.
from verl.utils.debug import marked_timer


class SeparateRayPPOTrainer(RayPPOTrainer):
    def _fit_compute_log_prob(self, batch: DataProto) -> DataProto:
        timing_raw = self.timing_raw
        bypass_recomputing_logprobs = rollout_corr_config and rollout_corr_config.get("bypass_mode", False)
        if bypass_recomputing_logprobs:  # Use `rollout_log_probs`
            apply_bypass_mode(batch=batch)
        else:  # Recompute old_log_probs
            with marked_timer("old_log_prob", timing_raw, color="blue"):
                old_log_prob, old_log_prob_mfu = self._compute_old_log_prob(batch)
        return batch
