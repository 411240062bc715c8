# Case: vLLM 0.8.5 to 0.11: V1's execute_model calls self.model(...) in a one-item `with`.
import torch


class GPUModelRunner(LoRAModelRunnerMixin):
    def __init__(self, vllm_config, device):
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.device = device

    @torch.inference_mode()
    def execute_model(self, scheduler_output, intermediate_tensors=None):
        self._update_states(scheduler_output)
        if not scheduler_output.total_num_scheduled_tokens:
            return EMPTY_MODEL_RUNNER_OUTPUT

        attn_metadata, logits_indices = self._prepare_inputs(scheduler_output)
        with set_forward_context(attn_metadata, self.vllm_config):
            output = self.model(input_ids=self.input_ids, positions=self.positions)
            if getattr(self, "_msprobe_open", False):  # rlprobe-patch
                from vllm.v1.worker.dispatch_logger import log_forward_pass

                log_forward_pass(self, scheduler_output, self.input_batch.req_ids)

        hidden_states = output[:num_scheduled_tokens]
        return self._sample(hidden_states[logits_indices])
