# Case: SGLang 0.5.3 (one `batch_or_worker_batch`, a ModelWorkerBatch only without speculative decoding).
class Scheduler:
    def run_batch(self, batch):
        self.forward_ct += 1
        if self.is_generation:
            batch_or_worker_batch = batch

            if self.spec_algorithm.is_none():
                # a comment in the block
                batch_or_worker_batch = batch.get_model_worker_batch()

            forward_batch_output = self.model_worker.forward_batch_generation(batch_or_worker_batch)
            return forward_batch_output
        else:  # embedding or reward model
            model_worker_batch = batch.get_model_worker_batch()
            ret = self.tp_worker.forward_batch_embedding(model_worker_batch)
        return ret
