# Case: verl 0.6.0's RayPPOTrainer.fit computes old log-probs inline.
import os


class RayPPOTrainer:
    def fit(self):
        for batch_dict in self.train_dataloader:
            metrics, timing_raw = {}, {}
            batch = DataProto.from_single_dict(batch_dict)
            with marked_timer("step", timing_raw):
                compute_prompts_only = int(os.getenv("PROMPTS_ONLY", "0"))  # rlprobe-patch
                if compute_prompts_only:
                    batch = self._prompts_only_batch(batch)
                # recompute old_log_probs
                with marked_timer("old_log_prob", timing_raw, color="blue"):
                    old_log_prob = self.actor_rollout_wg.compute_log_prob(batch)
                    batch = batch.union(old_log_prob)

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
