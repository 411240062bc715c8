# Case: a V2 model runner whose execute_model has no `dummy_run` parameter (every V2 release,
# 0.12 to 0.32, has it): the start hook reads it, so the file is refused, not patched.
import torch


class GPUModelRunner(LoRAModelRunnerMixin):
    def __init__(self, vllm_config: VllmConfig, device: torch.device):
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config

    @torch.inference_mode()
    def execute_model(self, scheduler_output, intermediate_tensors=None):
        input_batch = self.prepare_inputs(scheduler_output)
        if batch_desc.cg_mode == CUDAGraphMode.FULL:
            model_output = self.cudagraph_manager.run_fullgraph(batch_desc)
        else:
            with set_forward_context(attn_metadata, self.vllm_config, num_tokens=input_batch.num_tokens):
                self.kv_connector.pre_forward(scheduler_output)
                if batch_desc.cg_mode == CUDAGraphMode.PIECEWISE:
                    model_output = self.cudagraph_manager.run_pw_graph(self.model, model_inputs)
                else:
                    model_output = self.model(**model_inputs)

        self.execute_model_state = ExecuteModelState(input_batch, model_output)
        return None
