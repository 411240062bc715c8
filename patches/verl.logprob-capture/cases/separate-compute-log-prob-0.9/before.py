# Case: the separated trainer's own step method (inherited by the one-step-off and fully-async trainers).
class SeparateRayPPOTrainer(RayPPOTrainer):
    def _fit_compute_log_prob(self, batch):
        metrics = self.metrics
        bypass_recomputing_logprobs = rollout_corr_config and rollout_corr_config.get("bypass_mode", False)
        if bypass_recomputing_logprobs:
            apply_bypass_mode(batch=batch)
        else:
            with marked_timer("old_log_prob", self.timing_raw, color="blue"):
                old_log_prob, old_log_prob_mfu = self._compute_old_log_prob(batch)
                batch = batch.union(old_log_prob)
                if "rollout_log_probs" in batch.batch.keys():
                    from verl.utils.debug.metrics import calculate_debug_metrics

                    metrics.update(calculate_debug_metrics(batch))
        assert "old_log_probs" in batch.batch
        return batch
