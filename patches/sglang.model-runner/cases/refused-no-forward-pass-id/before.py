# Case (refused): SGLang 0.5.10's ModelRunner.forward without `self.forward_pass_id += 1`: no place to start.
import logging
import os

logger = logging.getLogger(__name__)


class ModelRunner(ModelRunnerKVCacheMixin):
    def __init__(self, model_config, mem_fraction_static, gpu_id, server_args, draft_model_idx=None):
        # Parse args
        self.mem_fraction_static = mem_fraction_static
        self.dp_size = server_args.dp_size if server_args.enable_dp_attention else 1

    def forward(self, forward_batch, skip_attn_backend_init=False, pp_proxy_tensors=None) -> ModelRunnerOutput:

        with get_global_expert_distribution_recorder().with_forward_pass(self.forward_pass_id, forward_batch) as rec:
            output = self._forward_raw(forward_batch, skip_attn_backend_init, pp_proxy_tensors)
        output.expert_distribution_metrics = rec.get("metrics")

        if dumper.may_enable:
            dumper.step()

        return output
