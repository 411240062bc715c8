# Case: the V1 trainer compares a DataProto fetched from TransferQueue; bypass returns early.
class PPOTrainer:
    def _compute_old_log_prob(self, batch, metrics):
        """Compute the old log prob of the batch."""
        bypass_recomputing_logprobs = rollout_corr_config and rollout_corr_config.get("bypass_mode", False)
        if bypass_recomputing_logprobs:
            return batch

        output = self.actor_rollout_wg.compute_log_prob(batch)
        data = DataProto(batch=fetch(batch).to_padded_tensor())

        if self.config.actor_rollout_ref.rollout.calculate_log_probs:
            metrics.update(calculate_debug_metrics(data))

        return batch
