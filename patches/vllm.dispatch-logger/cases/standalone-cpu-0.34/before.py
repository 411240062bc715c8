# Case: vLLM's standalone CPU runner (vllm/v1/worker/cpu/standalone_model_runner.py, new in 0.34):
# V2's shape without Triton and no subclass of GPUModelRunner; the forward inside
# `with set_forward_context(...)`, the pass's batch a local, the parameter `dummy_run`.
import torch


class StandaloneCPUModelRunner(LoRAModelRunnerMixin):
    def __init__(self, vllm_config: VllmConfig, device: torch.device):
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.device = device
        set_offloader(create_offloader(self.vllm_config.offload_config))

    def execute_model(self, scheduler_output, intermediate_tensors=None, dummy_run=False):
        if dummy_run:
            input_batch = InputBatch.make_dummy(num_reqs, num_tokens, self.input_buffers)
        else:
            input_batch = self.prepare_inputs(scheduler_output, batch_req_state)
        with set_forward_context(attn_metadata, self.vllm_config, num_tokens=input_batch.num_tokens_after_padding):
            self.kv_connector.pre_forward(scheduler_output, input_batch)
            model_output = self.model(**model_inputs)
        self.kv_connector.finish_forward()

        self.execute_model_state = ExecuteModelState(input_batch, model_output)
        return None
