# Case: vLLM-Ascend 0.13 to 0.19: the debugger stops inline, in execute_model and sample_tokens.
import torch


class NPUModelRunner(GPUModelRunner):
    def __init__(self, vllm_config, device):
        dump_cfg = self.ascend_config.dump_config_path
        self.debugger = None
        if dump_cfg is not None:
            from msprobe.pytorch import PrecisionDebugger

            self.debugger = PrecisionDebugger(dump_cfg)
        self._dispatch_logger = None  # rlprobe-patch
        if self.debugger is not None:
            from vllm_ascend.worker.dispatch_logger import DispatchLogger

            self._dispatch_logger = DispatchLogger.for_debugger(self.debugger)

    def execute_model(self, scheduler_output, intermediate_tensors=None):
        hidden_states = self._model_forward(scheduler_output)
        if not get_pp_group().is_last_rank:
            self._finish_msprobe_step(scheduler_output)  # rlprobe-patch
            if self.debugger is not None:
                self.debugger.stop()
                self.debugger.step()
            return hidden_states
        self.execute_model_state = (scheduler_output, hidden_states)
        return None

    def sample_tokens(self, grammar_output):
        (scheduler_output, logits) = self.execute_model_state
        model_runner_output = self._sample(logits)
        if not self.use_async_scheduling:
            self._finish_msprobe_step(scheduler_output)  # rlprobe-patch
            if self.debugger is not None:
                assert self.debugger is not None
                self.debugger.stop()
                self.debugger.step()
            return model_runner_output
        self._finish_msprobe_step(scheduler_output)  # rlprobe-patch
        if self.debugger is not None:
            self.debugger.stop()
            self.debugger.step()
        return AsyncGPUModelRunnerOutput(model_runner_output=model_runner_output)

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
