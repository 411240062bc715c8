# Case: the V1 trainer (0.9.0+) passes a KVBatchMeta; its rows live in TransferQueue.
import os

import transfer_queue as tq

from verl.utils import tensordict_utils as tu


class PPOTrainer(ABC):
    def _step_once(self, metrics: dict, timing_raw: dict, sample_batch_size: int) -> KVBatchMeta:
        """Run a single local update: sample one mini-batch and perform the full PPO pipeline once."""
        with marked_timer("gen", timing_raw, color="red"):
            batch, off_policy_metrics = self.replay_buffer.sample(global_steps=self.global_steps)

        # 3. balance batch across data parallel groups
        batch = self._balance_batch(batch, metrics=metrics)
        compute_prompts_only = int(os.getenv("PROMPTS_ONLY", "0"))  # rlprobe-patch
        if compute_prompts_only:
            batch = self._prompts_only_kv_batch(batch)

        # 4. compute old_log_prob
        with marked_timer("old_log_prob", timing_raw, color="blue"):
            batch = self._compute_old_log_prob(batch, metrics=metrics)
        return batch

    # Added by rlprobe-patch (verl.prompts-only); `rlprobe-patch revert` removes it.
    def _prompts_only_kv_batch(self, batch):
        # One row per sample in TransferQueue; `prompts` gives each row's prompt length.
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id)
        prompt_lens = [row.size(0) for row in data["prompts"].unbind(0)]
        trimmed = {}
        for key in data.keys():
            if key in ("input_ids", "attention_mask", "position_ids"):
                # [..., :n] cuts the last (sequence) axis of (L,) and mrope (3|4, L) rows alike.
                trimmed[key] = [row[..., :n] for row, n in zip(data[key].unbind(0), prompt_lens)]
            elif key in ("routed_experts", "teacher_ids", "teacher_logprobs"):
                trimmed[key] = [row[:n] for row, n in zip(data[key].unbind(0), prompt_lens)]
            elif key in ("responses", "response_mask", "loss_mask", "rollout_log_probs"):
                trimmed[key] = [row[:0] for row in data[key].unbind(0)]
        rows = [{key: values[i] for key, values in trimmed.items()} for i in range(len(batch))]
        # Stacked the way AgentLoopWorkerTQ stores them: jagged where lengths differ.
        tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=tu.list_of_dict_to_tensordict(rows))
        return batch
