"""Anchors of `vllm.dispatch-logger`.

- `DispatchLoggerModule`: the new file vllm/v1/worker/dispatch_logger.py (every release).
- `LogV1Forward` / `LogV2Forward`: in `GPUModelRunner.execute_model`, right after the one
  statement that runs the model's forward (`<name> = self.model(...)`, or
  `<name> = self._model_forward(...)` in V1 from 0.12), at any depth: inside the `with` block
  after which vllm.model-runner stops the msprobe step, so the two patches sit in one file without
  touching each other.
- `LogStandaloneCPUForward`: the same place in `StandaloneCPUModelRunner.execute_model` (from 0.34,
  vllm/v1/worker/cpu/standalone_model_runner.py: V2's shape, V2's hook).
"""

from rlprobe_patch.codemod import ANY, CreateFile, Hook, PatchCodemod, Where, assigns_call, self_call

runs_forward = assigns_call(None, self_call("model") | self_call("_model_forward"))
FORWARD = "`<name> = self.model(...)` or `<name> = self._model_forward(...)` in the method"


def log_after_forward(payload: str, cls: str = "GPUModelRunner") -> Hook:
    return Hook(cls, "execute_model", payload, Where.AFTER, ANY, anchor=runs_forward, expected=FORWARD)


class DispatchLoggerModule(CreateFile):
    DESCRIPTION = "the vLLM DispatchLogger module"
    FILE = "dispatch_logger.py"


class LogV1Forward(PatchCodemod):
    DESCRIPTION = "dispatch log after each forward of vLLM's V1 GPUModelRunner, before the msprobe step closes"
    OPERATIONS = (log_after_forward("log_forward"),)


class LogV2Forward(PatchCodemod):
    DESCRIPTION = "dispatch log after each eager forward of vLLM's V2 GPUModelRunner, before the msprobe step closes"
    OPERATIONS = (log_after_forward("log_forward_v2"),)


class LogStandaloneCPUForward(PatchCodemod):
    DESCRIPTION = "dispatch log after each forward of vLLM's standalone CPU runner, before the msprobe step closes"
    OPERATIONS = (log_after_forward("log_forward_v2", "StandaloneCPUModelRunner"),)
