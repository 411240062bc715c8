# Case: the V1 debug metrics moved into a nested block: the capture must stay in the method body.
class PPOTrainer:
    def _compute_old_log_prob(self, batch, metrics):
        data = DataProto(batch=fetch(batch).to_padded_tensor())
        for _ in range(1):
            if self.config.actor_rollout_ref.rollout.calculate_log_probs:
                metrics.update(calculate_debug_metrics(data))
        return batch
