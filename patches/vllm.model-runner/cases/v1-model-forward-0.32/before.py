# Case: vLLM 0.12 and later: V1's execute_model calls self._model_forward(...) in a parenthesised
# multi-item `with`; early returns before it; the sampling happens in sample_tokens.
import torch


class GPUModelRunner(LoRAModelRunnerMixin, KVConnectorModelRunnerMixin):
    def __init__(self, vllm_config: VllmConfig, device: torch.device):
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.execute_model_state = None

    def _model_forward(self, input_ids=None, positions=None, **model_kwargs):
        return self.model(input_ids=input_ids, positions=positions, **model_kwargs)

    @torch.inference_mode()
    def execute_model(self, scheduler_output, intermediate_tensors=None):
        if self.execute_model_state is not None:
            raise RuntimeError("sample_tokens() must be called after execute_model() returns None.")
        with record_function_or_nullcontext("gpu_model_runner: preprocess"):
            self._update_states(scheduler_output)
            if not scheduler_output.total_num_scheduled_tokens:
                return EMPTY_MODEL_RUNNER_OUTPUT

        with (
            set_forward_context(attn_metadata, self.vllm_config, num_tokens=num_tokens_padded),
            record_function_or_nullcontext("gpu_model_runner: forward"),
            self.maybe_get_kv_connector_output(scheduler_output) as kv_connector_output,
        ):
            model_output = self._model_forward(input_ids=input_ids, positions=positions, **model_kwargs)

        with record_function_or_nullcontext("gpu_model_runner: postprocess"):
            logits = self.model.compute_logits(model_output[logits_indices])
        self.execute_model_state = ExecuteModelState(scheduler_output, logits)
        return None
