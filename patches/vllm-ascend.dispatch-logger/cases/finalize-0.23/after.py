# Case: vLLM-Ascend 0.20.2rc1 and later: every stop goes through _finalize_dump_data.
import torch


class NPUModelRunner(GPUModelRunner):
    def __init__(self, vllm_config, device):
        self.debugger = None
        self._debugger_started = False
        self._dispatch_logger = None  # rlprobe-patch
        if self.debugger is not None:
            from vllm_ascend.worker.dispatch_logger import DispatchLogger

            self._dispatch_logger = DispatchLogger.for_debugger(self.debugger)

    def execute_model(self, scheduler_output, intermediate_tensors=None):
        with self.synchronize_input_prep():
            self._update_states(scheduler_output)

        self._start_dump_data()
        self._dump_scheduler_output = scheduler_output  # rlprobe-patch
        return self._run(scheduler_output)

    def _start_dump_data(self) -> None:
        if self.debugger is None or self._debugger_started:
            return
        self.debugger.start(self.model)
        self._debugger_started = True

    def _finalize_dump_data(self, **kwargs) -> None:
        if self.debugger is None or not self._debugger_started:
            return
        if hasattr(self.debugger, "stop"):
            self.debugger.stop()
            self._debugger_started = False
        if kwargs.get("dump", True):  # rlprobe-patch: dummy runs pass dump=False
            self._finish_msprobe_step(getattr(self, "_dump_scheduler_output", None))

        self.debugger.step(**kwargs)

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
