"""What `vllm-ascend.dispatch-logger` inserts into `vllm_ascend/worker/model_runner_v1.py`.

The new module `dispatch_logger.py` (beside this file) is added as
`vllm_ascend/worker/dispatch_logger.py`. In `NPUModelRunner`, a `DispatchLogger` is created
next to vLLM-Ascend's own msprobe debugger (only when dumping is configured), and every
step the debugger closes is logged first:

- 0.12 to 0.19: before every `self.debugger.stop()` block, in `execute_model` (its early
  returns) and in `sample_tokens` (the normal generation path: hooking `execute_model`
  alone would miss every normal step);
- 0.20.2rc1 and later: once, in `_finalize_dump_data` (skipping dummy runs, `dump=False`),
  with the `scheduler_output` stashed by `execute_model` next to `_start_dump_data()`.

The skill's checker looks for `DispatchLogger`, `_finish_msprobe_step` and `_dispatch_logger`.
"""

import torch


class NPUModelRunner:
    # Added by rlprobe-patch (vllm-ascend.dispatch-logger); `rlprobe-patch revert` removes it.
    def _finish_msprobe_step(self, scheduler_output):
        # Log the step the debugger is about to close; skipped once msprobe has dumped every step asked for.
        if getattr(self, "_dispatch_logger", None) is None or scheduler_output is None:
            return
        service = getattr(self.debugger, "service", None)
        if service is not None and service.should_stop_service:
            return
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        self._dispatch_logger.log_step(scheduler_output, step=getattr(service, "current_iter", None), rank=rank)


def create_dispatch_logger(self):
    """End of `NPUModelRunner.__init__` (the debugger exists by then)."""
    self._dispatch_logger = None  # rlprobe-patch
    if self.debugger is not None:
        from vllm_ascend.worker.dispatch_logger import DispatchLogger

        self._dispatch_logger = DispatchLogger.for_debugger(self.debugger)


def log_before_stop(self, scheduler_output):
    """0.12 to 0.19: right before each block that calls `self.debugger.stop()`."""
    self._finish_msprobe_step(scheduler_output)  # rlprobe-patch


def stash_scheduler_output(self, scheduler_output):
    """0.20.2rc1+: right after `self._start_dump_data()` in `execute_model`."""
    self._dump_scheduler_output = scheduler_output  # rlprobe-patch


def log_in_finalize(self, kwargs):
    """0.20.2rc1+: in `_finalize_dump_data`, right before `self.debugger.step(**kwargs)`."""
    if kwargs.get("dump", True):  # rlprobe-patch: dummy runs pass dump=False
        self._finish_msprobe_step(getattr(self, "_dump_scheduler_output", None))
