# Case: vLLM-Ascend 0.20.2rc1 and later: every stop goes through _finalize_dump_data.
import torch


class NPUModelRunner(GPUModelRunner):
    def __init__(self, vllm_config, device):
        self.debugger = None
        self._debugger_started = False

    def execute_model(self, scheduler_output, intermediate_tensors=None):
        with self.synchronize_input_prep():
            self._update_states(scheduler_output)

        self._start_dump_data()
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

        self.debugger.step(**kwargs)
