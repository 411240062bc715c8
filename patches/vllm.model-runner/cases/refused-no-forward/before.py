# Case: a model runner whose execute_model hands the forward to another object: no anchor.
import torch


class GPUModelRunner(LoRAModelRunnerMixin):
    def __init__(self, vllm_config, device):
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config

    def execute_model(self, scheduler_output, intermediate_tensors=None):
        with set_forward_context(attn_metadata, self.vllm_config):
            return self.executor.run(self.model, scheduler_output)
