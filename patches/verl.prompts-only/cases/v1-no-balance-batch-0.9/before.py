# Case: a V1 `_step_once` without the `_balance_batch` call before the old-log-prob block (as with
# a release that balances elsewhere). Not refused: the anchor is the old-log-prob block, and the
# trim there covers every row the old-log-prob pass reads.
import os

import transfer_queue as tq

from verl.utils import tensordict_utils as tu


class PPOTrainer(ABC):
    def _step_once(self, metrics: dict, timing_raw: dict, sample_batch_size: int) -> KVBatchMeta:
        with marked_timer("gen", timing_raw, color="red"):
            batch, off_policy_metrics = self.replay_buffer.sample(global_steps=self.global_steps)

        with marked_timer("old_log_prob", timing_raw, color="blue"):
            batch = self._compute_old_log_prob(batch, metrics=metrics)
        return batch
