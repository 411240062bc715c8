# Case: SGLang 0.4.6.post5's ModelRunner (no dp_size yet, tuple return type).
import logging
import os

logger = logging.getLogger(__name__)


class ModelRunner:
    """ModelRunner runs the forward passes of the models."""

    def __init__(self, model_config, mem_fraction_static, gpu_id, tp_rank, tp_size, nccl_port, server_args):
        self._init_msprobe_debugger(server_args)  # rlprobe-patch
        # Parse args
        self.model_config = model_config
        self.mem_fraction_static = mem_fraction_static
        self.gpu_id = gpu_id
        self.forward_pass_id = 0

    def forward(self, forward_batch, skip_attn_backend_init=False, pp_proxy_tensors=None):
        self.forward_pass_id += 1
        if self.msprobe_debugger is not None:  # rlprobe-patch
            self.msprobe_debugger.start(model=self.model, rank_id=self._msprobe_rank_id())
        with get_global_expert_distribution_recorder().with_forward_pass(self.forward_pass_id, forward_batch):
            output = self._forward_raw(forward_batch, skip_attn_backend_init, pp_proxy_tensors)
        if self.eplb_manager is not None:
            self.eplb_manager.on_forward_pass_end(self.forward_pass_id)
        if self.msprobe_debugger is not None:  # rlprobe-patch
            self.msprobe_debugger.stop()
            self.msprobe_debugger.step()
        return output

    # Added by rlprobe-patch (sglang.model-runner); `rlprobe-patch revert` removes it.
    def _init_msprobe_debugger(self, server_args):
        self.msprobe_debugger = None
        mode = str(getattr(server_args, "disaggregation_mode", "null"))
        if mode == "prefill":
            config_path = os.environ.get("MSPROBE_SGLANG_PREFILL_CONFIG", "./config_prefill.json")
        elif mode == "decode":
            config_path = os.environ.get("MSPROBE_SGLANG_DECODE_CONFIG", "./config_decode.json")
        else:
            config_path = os.environ.get("MSPROBE_SGLANG_CONFIG", "./config.json")
        if not os.path.isfile(config_path):
            return
        from msprobe.pytorch import PrecisionDebugger, seed_all

        seed_all(mode=True)
        self.msprobe_debugger = PrecisionDebugger(config_path=config_path)
        logger.info(f"msprobe dump enabled with {config_path}")

    def _msprobe_rank_id(self):
        # Data parallel > 1: name the dump after the GPU (dp_size exists from SGLang 0.4.8).
        dp_size = getattr(self, "dp_size", None) or 1
        return self.gpu_id if dp_size > 1 else None
