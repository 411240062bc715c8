# Case (refused): `SeparateRayPPOTrainer._fit_compute_log_prob` (shaped like 0.9.1's) whose
# recompute branch calls `_compute_old_log_prob` without its `marked_timer("old_log_prob", ...)`
# block: nothing says where the old-log-prob pass starts.
from verl.utils.debug import marked_timer


class SeparateRayPPOTrainer(RayPPOTrainer):
    def _fit_compute_log_prob(self, batch: DataProto) -> DataProto:
        timing_raw = self.timing_raw
        bypass_recomputing_logprobs = rollout_corr_config and rollout_corr_config.get("bypass_mode", False)
        if bypass_recomputing_logprobs:  # Use `rollout_log_probs`
            apply_bypass_mode(batch=batch)
        else:  # Recompute old_log_probs
            old_log_prob, old_log_prob_mfu = self._compute_old_log_prob(batch)
            batch = batch.union(old_log_prob)
        return batch
