# Case (refused): verl 0.6.0's fit with the `old_log_prob` timer block written twice: ambiguous.
import os


class RayPPOTrainer:
    def fit(self):
        for batch_dict in self.train_dataloader:
            metrics, timing_raw = {}, {}
            batch = DataProto.from_single_dict(batch_dict)
            with marked_timer("step", timing_raw):
                # recompute old_log_probs
                with marked_timer("old_log_prob", timing_raw, color="blue"):
                    old_log_prob = self.actor_rollout_wg.compute_log_prob(batch)
                    batch = batch.union(old_log_prob)
                with marked_timer("old_log_prob", timing_raw, color="blue"):
                    old_log_prob = self.actor_rollout_wg.compute_log_prob(batch)
                    batch = batch.union(old_log_prob)
