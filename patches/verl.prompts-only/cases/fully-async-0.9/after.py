# Case: the experimental fully-async trainer takes its samples from a queue.
import os


class FullyAsyncTrainer(SeparateRayPPOTrainer):
    async def _fit_generate(self, batch: DataProto = None) -> DataProto | None:
        metrics = self.metrics
        with marked_timer("gen", self.timing_raw, color="red"):
            epoch, batch = await self._get_samples_from_queue()
        compute_prompts_only = int(os.getenv("PROMPTS_ONLY", "0"))  # rlprobe-patch
        if compute_prompts_only and "responses" in batch.batch.keys():
            batch = self._prompts_only_batch(batch)
        batch.meta_info["temperature"] = self.config.actor_rollout_ref.rollout.temperature
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
