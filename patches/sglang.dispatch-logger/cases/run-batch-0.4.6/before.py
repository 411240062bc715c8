# Case: SGLang 0.4.6 to 0.4.10 (`model_worker_batch` built in the non-speculative branch of the
# generation path; the embedding path builds one too, which is not hooked).
class Scheduler:
    def run_batch(self, batch):
        self.forward_ct += 1
        if self.is_generation:
            if self.spec_algorithm.is_none():
                model_worker_batch = batch.get_model_worker_batch()
                logits_output, next_token_ids, can_run_cuda_graph = self.tp_worker.forward_batch_generation(
                    model_worker_batch
                )
                bid = model_worker_batch.bid
            else:
                logits_output, next_token_ids, bid = self.draft_worker.forward_batch_speculative_generation(batch)
            ret = (logits_output, next_token_ids, bid)
        else:  # embedding or reward model
            model_worker_batch = batch.get_model_worker_batch()
            embeddings = self.tp_worker.forward_batch_embedding(model_worker_batch)
            ret = embeddings
        return ret
