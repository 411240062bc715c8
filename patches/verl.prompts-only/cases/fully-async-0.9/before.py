# Case: the experimental fully-async trainer takes its samples from a queue.
import os


class FullyAsyncTrainer(SeparateRayPPOTrainer):
    async def _fit_generate(self, batch: DataProto = None) -> DataProto | None:
        metrics = self.metrics
        with marked_timer("gen", self.timing_raw, color="red"):
            epoch, batch = await self._get_samples_from_queue()
        batch.meta_info["temperature"] = self.config.actor_rollout_ref.rollout.temperature
        return batch
