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

        # 4. compute old_log_prob
        with marked_timer("old_log_prob", timing_raw, color="blue"):
            batch = self._compute_old_log_prob(batch, metrics=metrics)
        return batch
