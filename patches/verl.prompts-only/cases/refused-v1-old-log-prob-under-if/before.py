# Case (refused): a V1 `_step_once` whose `marked_timer("old_log_prob", ...)` block moved under a
# condition. The trim belongs right before the block, in the method body; inside the branch it
# would run only on that branch, before it on every step: not guessed.
import transfer_queue as tq

from verl.utils import tensordict_utils as tu


class PPOTrainer(ABC):
    def _step_once(self, metrics: dict, timing_raw: dict, sample_batch_size: int) -> KVBatchMeta:
        with marked_timer("gen", timing_raw, color="red"):
            batch, off_policy_metrics = self.replay_buffer.sample(global_steps=self.global_steps)

        batch = self._balance_batch(batch, metrics=metrics)

        if self.recompute_old_log_prob:
            with marked_timer("old_log_prob", timing_raw, color="blue"):
                batch = self._compute_old_log_prob(batch, metrics=metrics)

        with marked_timer("adv", timing_raw, color="brown"):
            batch = self._compute_advantage(batch, metrics=metrics)
        return batch
