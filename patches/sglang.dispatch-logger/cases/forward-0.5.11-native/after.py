# Case: SGLang 0.5.11 (its own msprobe debugger; the step span and the recorder in one parenthesised `with`).
import contextlib


class ModelRunner:
    def forward(self, forward_batch, skip_attn_backend_init=False, pp_proxy_tensors=None) -> ModelRunnerOutput:
        self.forward_pass_id += 1

        # Try msprob debugger
        if self.msprobe_debugger is not None:
            rank_id = self.gpu_id if self.dp_size is not None and self.dp_size > 1 else None
            self.msprobe_debugger.start(model=self.model, rank_id=rank_id)

        step_span_ctx = contextlib.nullcontext()
        with (
            step_span_ctx,
            get_global_expert_distribution_recorder().with_forward_pass(
                self.forward_pass_id,
                forward_batch,
            ) as recorder_outputs,
        ):
            output = self._forward_raw(forward_batch, skip_attn_backend_init, pp_proxy_tensors)
        if getattr(self, "msprobe_debugger", None) is not None:  # rlprobe-patch
            from sglang.srt.model_executor.dispatch_logger import log_forward_pass

            log_forward_pass(self, forward_batch)
        output.expert_distribution_metrics = recorder_outputs.get("metrics")

        if self.msprobe_debugger is not None:
            self.msprobe_debugger.stop()
            self.msprobe_debugger.step()

        return output

    def _forward_raw(self, forward_batch, skip_attn_backend_init, pp_proxy_tensors):
        return self.model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)
