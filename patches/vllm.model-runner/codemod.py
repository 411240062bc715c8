"""Anchors of `vllm.model-runner` in vLLM's `GPUModelRunner` (V1 from 0.8.5 until 0.34 removed
it; V2 from the release that has `vllm/v1/worker/gpu/model_runner.py`) and, from 0.34, in the
standalone CPU runner `StandaloneCPUModelRunner` (`vllm/v1/worker/cpu/standalone_model_runner.py`,
V2's shape, no subclass of `GPUModelRunner`: it takes the same methods and the same hooks as V2).

- `__init__`: its end (the config, the model config and the worker's device are set by then);
- `execute_model`: the one statement that runs the model's forward, at any depth:
  `<name> = self.model(...)` (V1 to 0.11, V2 eager, standalone CPU) or
  `<name> = self._model_forward(...)` (V1 from 0.12), and the one `with` block that holds it
  (`set_forward_context(...)`); in V2 and the standalone CPU runner its parameter `dummy_run`
  (every release of either, 0.12 to 0.34).
"""

from dataclasses import replace

import libcst as cst
import libcst.matchers as m

from rlprobe_patch.codemod import ANY, METHOD, AddMethods, Hook, PatchCodemod, Where, assigns_call, findall, self_call

runs_forward = assigns_call(None, self_call("model") | self_call("_model_forward"))


def holds_forward(stmt: cst.BaseStatement) -> bool:
    """The `with` block whose body (at any depth) runs the model's forward."""
    if not isinstance(stmt, cst.With):
        return False
    return any(runs_forward(line) for line in findall(stmt.body, m.SimpleStatementLine()))  # type: ignore[arg-type]


FORWARD = "`<name> = self.model(...)` or `<name> = self._model_forward(...)` in the method"


INIT = Hook("GPUModelRunner", "__init__", "create_debugger", Where.END, METHOD, expected="the method body")
FINISH = Hook(
    "GPUModelRunner",
    "execute_model",
    "finish_forward",
    Where.AFTER,
    ANY,
    anchor=holds_forward,
    expected=f"a `with` block holding {FORWARD}",
)


class V1Runner(PatchCodemod):
    DESCRIPTION = "msprobe debugger around each forward pass of vLLM's V1 GPUModelRunner"
    REQUIRES_MODULE_NAMES = ("torch",)
    OPERATIONS = (
        AddMethods("GPUModelRunner"),
        INIT,
        Hook(
            "GPUModelRunner", "execute_model", "start_forward", Where.BEFORE, ANY, anchor=runs_forward, expected=FORWARD
        ),
        FINISH,
    )


class V2Runner(PatchCodemod):
    DESCRIPTION = "msprobe debugger around each eager forward pass of vLLM's V2 GPUModelRunner"
    REQUIRES_MODULE_NAMES = ("torch",)
    OPERATIONS = (
        AddMethods("GPUModelRunner"),
        INIT,
        Hook(
            "GPUModelRunner",
            "execute_model",
            "start_forward_v2",
            Where.BEFORE,
            ANY,
            anchor=runs_forward,
            expected=FORWARD,
            parameters=("dummy_run",),  # vLLM's own passes (memory profile, DP idle) are not dumped
        ),
        FINISH,
    )


def in_class(cls: str, operations: tuple[AddMethods | Hook, ...]) -> tuple[AddMethods | Hook, ...]:
    """`operations` (the payload's GPUModelRunner methods, hooks in its methods) for the class `cls`."""
    return tuple(
        AddMethods(cls, payload_cls=op.payload_cls or op.cls) if isinstance(op, AddMethods) else replace(op, cls=cls)
        for op in operations
    )


class StandaloneCPURunner(PatchCodemod):
    DESCRIPTION = "msprobe debugger around each forward pass of vLLM's standalone CPU runner (V2's shape)"
    REQUIRES_MODULE_NAMES = ("torch",)
    OPERATIONS = in_class("StandaloneCPUModelRunner", V2Runner.OPERATIONS)
