# Case: vLLM's V2 model runner (vllm/v1/worker/gpu/model_runner.py): a full-graph replay branch,
# and the eager call inside `with set_forward_context(...)` after the piecewise branch.
import torch


class GPUModelRunner(LoRAModelRunnerMixin):
    def __init__(self, vllm_config: VllmConfig, device: torch.device):
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config

    @torch.inference_mode()
    def execute_model(self, scheduler_output, intermediate_tensors=None, dummy_run=False):
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
