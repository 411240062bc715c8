# Case (refused): vLLM-Ascend 0.13's runner without any `self.debugger.stop()`: no step to log.
import torch


class NPUModelRunner(GPUModelRunner):
    def __init__(self, vllm_config, device):
        dump_cfg = self.ascend_config.dump_config_path
        self.debugger = None
        if dump_cfg is not None:
            from msprobe.pytorch import PrecisionDebugger

            self.debugger = PrecisionDebugger(dump_cfg)

    def execute_model(self, scheduler_output, intermediate_tensors=None):
        hidden_states = self._model_forward(scheduler_output)
        if not get_pp_group().is_last_rank:
            if self.debugger is not None:
                self.debugger.step()
            return hidden_states
        self.execute_model_state = (scheduler_output, hidden_states)
        return None

    def sample_tokens(self, grammar_output):
        (scheduler_output, logits) = self.execute_model_state
        model_runner_output = self._sample(logits)
        if not self.use_async_scheduling:
            if self.debugger is not None:
                assert self.debugger is not None
                self.debugger.step()
            return model_runner_output
        if self.debugger is not None:
            self.debugger.step()
        return AsyncGPUModelRunnerOutput(model_runner_output=model_runner_output)
