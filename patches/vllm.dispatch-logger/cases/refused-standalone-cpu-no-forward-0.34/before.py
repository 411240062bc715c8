# Case: a standalone CPU runner whose execute_model runs the forward through a helper of its own:
# no anchor, refused.
import torch


class StandaloneCPUModelRunner(LoRAModelRunnerMixin):
    def execute_model(self, scheduler_output, intermediate_tensors=None, dummy_run=False):
        with set_forward_context(attn_metadata, self.vllm_config):
            model_output = self._run_model(model_inputs)
        return None
