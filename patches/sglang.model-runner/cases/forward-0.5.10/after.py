# Case: SGLang 0.5.7 to 0.5.10.post1 (KV-cache mixin, ModelRunnerOutput, SGLang's own dumper step).
import logging
import os

logger = logging.getLogger(__name__)


class ModelRunner(ModelRunnerKVCacheMixin):
    def __init__(self, model_config, mem_fraction_static, gpu_id, server_args, draft_model_idx=None):
        self._init_msprobe_debugger(server_args)  # rlprobe-patch
        # Parse args
        self.mem_fraction_static = mem_fraction_static
        self.dp_size = server_args.dp_size if server_args.enable_dp_attention else 1

    def forward(self, forward_batch, skip_attn_backend_init=False, pp_proxy_tensors=None) -> ModelRunnerOutput:
        self.forward_pass_id += 1
        if self.msprobe_debugger is not None:  # rlprobe-patch
            self.msprobe_debugger.start(model=self.model, rank_id=self._msprobe_rank_id())

        with get_global_expert_distribution_recorder().with_forward_pass(self.forward_pass_id, forward_batch) as rec:
            output = self._forward_raw(forward_batch, skip_attn_backend_init, pp_proxy_tensors)
        output.expert_distribution_metrics = rec.get("metrics")

        if dumper.may_enable:
            dumper.step()
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
