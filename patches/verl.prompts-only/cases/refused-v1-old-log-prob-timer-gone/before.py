# Case (refused): a V1 `_step_once` (shaped like 0.9.1's) whose old-log-prob step lost its
# `marked_timer("old_log_prob", ...)` block (as if the timer moved into `_compute_old_log_prob`):
# nothing says where the old-log-prob pass starts.
import transfer_queue as tq

from verl.utils import tensordict_utils as tu


class PPOTrainer(ABC):
    def _step_once(self, metrics: dict, timing_raw: dict, sample_batch_size: int) -> KVBatchMeta:
        with marked_timer("gen", timing_raw, color="red"):
            batch, off_policy_metrics = self.replay_buffer.sample(global_steps=self.global_steps)

        batch = self._balance_batch(batch, metrics=metrics)

        batch = self._compute_old_log_prob(batch, metrics=metrics)

        with marked_timer("adv", timing_raw, color="brown"):
            batch = self._compute_advantage(batch, metrics=metrics)
        return batch
