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
                    compute_prompts_only = int(os.getenv("PROMPTS_ONLY", "0"))  # rlprobe-patch
                    if compute_prompts_only:
                        batch = self._prompts_only_batch(batch)
                    with marked_timer("old_log_prob", timing_raw, color="blue"):
                        old_log_prob, old_log_prob_mfu = self._compute_old_log_prob(batch)

    # Added by rlprobe-patch (verl.prompts-only); `rlprobe-patch revert` removes it.
    def _prompts_only_batch(self, data):
        responses_len = data.batch["responses"].size(1)
        if responses_len:
            for key in ("input_ids", "attention_mask", "position_ids"):
                if key in data.batch.keys():
                    # [..., :-n] cuts the last (sequence) axis of 2-D and 3-D tensors alike.
                    data.batch[key] = data.batch[key][..., :-responses_len]
        for key in ("responses", "rollout_log_probs", "response_mask"):
            if key in data.batch.keys():
                data.batch[key] = data.batch[key][:, :0]
        return data
