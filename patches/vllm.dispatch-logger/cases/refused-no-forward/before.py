# Case: an execute_model that runs the forward through a runner of its own: no anchor.
import torch


class GPUModelRunner(LoRAModelRunnerMixin):
    def execute_model(self, scheduler_output, intermediate_tensors=None):
        with set_forward_context(attn_metadata, self.vllm_config):
            hidden_states = self.graph_runner(input_ids, positions)
        return hidden_states
