# Case: a fit that no longer computes the debug metrics itself: nowhere to capture.
class RayPPOTrainer:
    def fit(self):
        for batch_dict in self.train_dataloader:
            with marked_timer("old_log_prob", timing_raw, color="blue"):
                batch = batch.union(self.actor_rollout_wg.compute_log_prob(batch))
                metrics.update(self.debug_metrics(batch))
