# Case: SGLang 0.5.23 (walrus-bound canary context first; an `if` with a walrus after the block).
import contextlib


class ModelRunner:
    def forward(self, forward_batch, skip_attn_backend_init=None, pp_proxy_tensors=None) -> ModelRunnerOutput:
        forward_batch.apply_deprecated_skip_attn_backend_init(skip_attn_backend_init)

        self.forward_pass_id += 1

        if self.msprobe_debugger is not None:
            rank_id = self.gpu_id if get_parallel().dp_size > 1 else None
            self.msprobe_debugger.start(model=self.model, rank_id=rank_id)

        canary_ctx = c.with_active_single_forward_manager(0) if (c := self.canary_manager) else contextlib.nullcontext()

        with (
            canary_ctx,
            get_global_expert_distribution_recorder().with_step(
                self.forward_pass_id,
                forward_batch,
            ) as recorder_outputs,
        ):
            output = self._forward_raw(forward_batch, pp_proxy_tensors)
        output.expert_distribution_metrics = recorder_outputs.get("metrics")

        if (indexer_capturer := get_global_indexer_capturer()) is not None:
            output.indexer_topk_output = indexer_capturer.on_forward_end(forward_batch=forward_batch)

        if self.msprobe_debugger is not None:
            self.msprobe_debugger.stop()
            self.msprobe_debugger.step()

        return output
