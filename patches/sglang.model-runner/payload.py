"""What `sglang.model-runner` inserts into `sglang/srt/model_executor/model_runner.py` (SGLang < 0.5.11).

msprobe's own instructions for SGLang before 0.5.11, as code: a `PrecisionDebugger` created
in `ModelRunner.__init__`, started after `self.forward_pass_id += 1` in `forward` and stopped
and stepped before its single `return output`: one msprobe step per forward pass. The
attribute is `msprobe_debugger`, the name SGLang itself uses from 0.5.11.

The config is `MSPROBE_SGLANG_CONFIG` (default baked in by `apply --sglang-config PATH`);
with prefill/decode disaggregation, `MSPROBE_SGLANG_PREFILL_CONFIG` /
`MSPROBE_SGLANG_DECODE_CONFIG` (defaults ./config_prefill.json, ./config_decode.json) by
`server_args.disaggregation_mode`, since the two roles must dump to different paths. No
variable set and no default file there: no debugger, and SGLang runs exactly as before. A
variable that is set must name a readable JSON config that msprobe accepts: otherwise
`ModelRunner.__init__` stops with an error naming the variable and the file. `DUMP_ON`,
`PROMPTS_ONLY` and `DUMP_PHASE` are checked by the shared switch reader (a wrong value stops
SGLang too); they do not switch this debugger, its config does.
"""

import logging
import os

from _shared.inference_switches import InferenceSwitches
from _shared.switches import Switches

logger = logging.getLogger(__name__)  # model_runner.py defines it


class ModelRunner:
    # Added by rlprobe-patch (sglang.model-runner); `rlprobe-patch revert` removes it.
    def _init_msprobe_debugger(self, server_args):
        # The switches are checked once per process (a wrong value stops SGLang here).
        self.msprobe_debugger = None
        self._rlprobe_run_switches()
        mode = str(getattr(server_args, "disaggregation_mode", "null"))
        if mode == "prefill":
            config_path = self._msprobe_config_path("MSPROBE_SGLANG_PREFILL_CONFIG", "./config_prefill.json")
        elif mode == "decode":
            config_path = self._msprobe_config_path("MSPROBE_SGLANG_DECODE_CONFIG", "./config_decode.json")
        else:
            config_path = self._msprobe_config_path("MSPROBE_SGLANG_CONFIG", "./config.json")
        if config_path is None:
            return
        self.msprobe_debugger = self._rlprobe_debugger(self._msprobe_config_variable, config_path)
        dump_path = self.msprobe_debugger.config.dump_path
        self._rlprobe_announce("sglang.model-runner r2", None, config_path, dump_path)
        logger.info(f"msprobe dump enabled with {config_path}")

    def _msprobe_config_path(self, variable, default):
        # A variable that is set must name a readable JSON config (else an error naming it);
        # unset, the default is used when that file exists, else no debugger, as before.
        self._msprobe_config_variable = variable
        if not os.environ.get(variable, "").strip() and not os.path.isfile(default):
            return None
        return self._rlprobe_config_path(variable, default)

    def _msprobe_rank_id(self):
        # Data parallel > 1: name the dump after the GPU (dp_size exists from SGLang 0.4.8).
        dp_size = getattr(self, "dp_size", None) or 1
        return self.gpu_id if dp_size > 1 else None

    # The switch reader (patches/_shared/switches.py), with the inference side's reading of
    # DUMP_PHASE (patches/_shared/inference_switches.py: verl's or slime's grammar).
    _rlprobe_on_rank = Switches._rlprobe_on_rank
    _rlprobe_switch = Switches._rlprobe_switch
    _rlprobe_switches = InferenceSwitches._rlprobe_switches
    _rlprobe_config_path = Switches._rlprobe_config_path
    _rlprobe_run_switches = Switches._rlprobe_run_switches
    _rlprobe_debugger = Switches._rlprobe_debugger
    _rlprobe_announce = Switches._rlprobe_announce


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
