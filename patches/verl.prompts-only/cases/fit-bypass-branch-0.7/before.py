# Case: from 0.6.1 the old-log-prob pass sits in the recompute branch of the bypass switch.
import os


class RayPPOTrainer:
    def _compute_old_log_prob(self, batch):
        return self.actor_rollout_wg.compute_log_prob(batch), 0

    def fit(self):
        for batch_dict in self.train_dataloader:
            with marked_timer("step", timing_raw):
                bypass_recomputing_logprobs = rollout_corr_config and rollout_corr_config.get("bypass_mode", False)
                if bypass_recomputing_logprobs:  # Use `rollout_log_probs`
                    apply_bypass_mode(batch=batch)
                else:  # Recompute old_log_probs
                    with marked_timer("old_log_prob", timing_raw, color="blue"):
                        old_log_prob, old_log_prob_mfu = self._compute_old_log_prob(batch)
