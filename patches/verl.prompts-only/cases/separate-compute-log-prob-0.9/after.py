# Case: the experimental separated trainer (0.7.1+; one-step-off inherits it) has its own
# old-log-prob step, in the recompute branch; its module does not import os.
from verl.utils.debug import marked_timer


class SeparateRayPPOTrainer(RayPPOTrainer):
    def _fit_compute_log_prob(self, batch: DataProto) -> DataProto:
        timing_raw = self.timing_raw
        bypass_recomputing_logprobs = rollout_corr_config and rollout_corr_config.get("bypass_mode", False)
        if bypass_recomputing_logprobs:  # Use `rollout_log_probs`
            apply_bypass_mode(batch=batch)
        else:  # Recompute old_log_probs
            import os  # rlprobe-patch: separation/ray_trainer.py does not import os

            compute_prompts_only = int(os.getenv("PROMPTS_ONLY", "0"))  # rlprobe-patch
            if compute_prompts_only:
                batch = self._prompts_only_batch(batch)
            with marked_timer("old_log_prob", timing_raw, color="blue"):
                old_log_prob, old_log_prob_mfu = self._compute_old_log_prob(batch)
        return batch

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
