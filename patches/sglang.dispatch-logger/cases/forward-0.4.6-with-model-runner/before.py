# Case: SGLang 0.4.6.post5 to 0.5.10.post1, already patched by sglang.model-runner (its start after
# `self.forward_pass_id += 1`, its stop before `return output`): the log goes after the `with` block.
import logging
import os

logger = logging.getLogger(__name__)


class ModelRunner:
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
