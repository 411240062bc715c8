# Case: SGLang 0.4.6.post5's ModelRunner (no dp_size yet, tuple return type).
import logging
import os

logger = logging.getLogger(__name__)


class ModelRunner:
    """ModelRunner runs the forward passes of the models."""

    def __init__(self, model_config, mem_fraction_static, gpu_id, tp_rank, tp_size, nccl_port, server_args):
        # Parse args
        self.model_config = model_config
        self.mem_fraction_static = mem_fraction_static
        self.gpu_id = gpu_id
        self.forward_pass_id = 0

    def forward(self, forward_batch, skip_attn_backend_init=False, pp_proxy_tensors=None):
        self.forward_pass_id += 1
        with get_global_expert_distribution_recorder().with_forward_pass(self.forward_pass_id, forward_batch):
            output = self._forward_raw(forward_batch, skip_attn_backend_init, pp_proxy_tensors)
        if self.eplb_manager is not None:
            self.eplb_manager.on_forward_pass_end(self.forward_pass_id)
        return output
