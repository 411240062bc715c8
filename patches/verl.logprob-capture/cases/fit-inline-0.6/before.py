# Case: up to 0.6.0 the debug metrics are computed inline in fit, in the old-log-prob block.
class RayPPOTrainer:
    def fit(self):
        """The training loop."""
        for batch_dict in self.train_dataloader:
            with marked_timer("step", timing_raw):
                with marked_timer("old_log_prob", timing_raw, color="blue"):
                    old_log_prob = self.actor_rollout_wg.compute_log_prob(batch)
                    batch = batch.union(old_log_prob)

                    if "rollout_log_probs" in batch.batch.keys():
                        from verl.utils.debug.metrics import calculate_debug_metrics

                        metrics.update(calculate_debug_metrics(batch))

                if self.use_reference_policy:
                    batch = batch.union(self.ref_policy_wg.compute_ref_log_prob(batch))
