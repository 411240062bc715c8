# Case: a standalone CPU runner whose execute_model has no `dummy_run` parameter (0.34's has it):
# the start hook reads it, so the file is refused, not patched.
import torch


class StandaloneCPUModelRunner(LoRAModelRunnerMixin):
    def __init__(self, vllm_config: VllmConfig, device: torch.device):
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config

    def execute_model(self, scheduler_output, intermediate_tensors=None):
        input_batch = self.prepare_inputs(scheduler_output, batch_req_state)
        with set_forward_context(attn_metadata, self.vllm_config, num_tokens=input_batch.num_tokens_after_padding):
            self.kv_connector.pre_forward(scheduler_output, input_batch)
            model_output = self.model(**model_inputs)
        self.kv_connector.finish_forward()
        return None
