# Case: from 0.6.1 the old-log-prob pass sits in the recompute branch of the bypass switch.
class RayPPOTrainer:
    def fit(self):
        for batch_dict in self.train_dataloader:
            with marked_timer("step", timing_raw):
                bypass_recomputing_logprobs = rollout_corr_config and rollout_corr_config.get("bypass_mode", False)
                if bypass_recomputing_logprobs:
                    apply_bypass_mode(batch=batch)
                else:
                    with marked_timer("old_log_prob", timing_raw, color="blue"):
                        old_log_prob, old_log_prob_mfu = self._compute_old_log_prob(batch)
                        batch = batch.union(old_log_prob)
                        if "rollout_log_probs" in batch.batch.keys():
                            from verl.utils.debug.metrics import calculate_debug_metrics

                            metrics.update(calculate_debug_metrics(batch))

                assert "old_log_probs" in batch.batch
