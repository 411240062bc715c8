"""What `sglang.model-runner` inserts into `sglang/srt/model_executor/model_runner.py` (SGLang < 0.5.11).

msprobe's own instructions for SGLang before 0.5.11, as code: a `PrecisionDebugger` created
in `ModelRunner.__init__`, started after `self.forward_pass_id += 1` in `forward` and stopped
and stepped before its single `return output`: one msprobe step per forward pass. The
attribute is `msprobe_debugger`, the name SGLang itself uses from 0.5.11.

The config is `MSPROBE_SGLANG_CONFIG` (default baked in by `apply --sglang-config PATH`);
with prefill/decode disaggregation, `MSPROBE_SGLANG_PREFILL_CONFIG` /
`MSPROBE_SGLANG_DECODE_CONFIG` (defaults ./config_prefill.json, ./config_decode.json) by
`server_args.disaggregation_mode`, since the two roles must dump to different paths. No
config file there: no debugger, and SGLang runs exactly as before.
"""

import logging
import os

logger = logging.getLogger(__name__)  # model_runner.py defines it


class ModelRunner:
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


def create_debugger(self, server_args):
    """First statement of `ModelRunner.__init__`, before its `# Parse args` block."""
    self._init_msprobe_debugger(server_args)  # rlprobe-patch


def start_forward(self):
    """Right after `self.forward_pass_id += 1` in `ModelRunner.forward`."""
    if self.msprobe_debugger is not None:  # rlprobe-patch
        self.msprobe_debugger.start(model=self.model, rank_id=self._msprobe_rank_id())


def finish_forward(self):
    """Right before the single `return output` of `ModelRunner.forward`."""
    if self.msprobe_debugger is not None:  # rlprobe-patch
        self.msprobe_debugger.stop()
        self.msprobe_debugger.step()
