"""Anchors of `verl.megatron-engine` (verl/workers/engine/megatron/transformer_impl.py).

- `MegatronEngine.forward_backward_batch`: its first statement (decide this call's phase)
  and `losses_reduced = forward_backward_func(...)` (close a step a pipeline stage left open).
- `MegatronEngineWithLMHead.forward_step`: `batch: TensorDict = next(batch_iter)`, the first
  statement in every release 0.6.0 to 0.10.0.dev; the signature gained
  `logits_processor_func` in 0.8.0, which the anchor ignores.
- `MegatronEngineWithLMHead.postprocess_micro_batch_func`: every `return <loss>, ...`. The
  loss that Megatron runs backward from is the first element, whatever its name:
  `loss` (0.6.x, scaled in place), `scaled_loss` (>= 0.7.0), `local_sum` (the per-token-loss
  3-tuple of >= 0.9.0).
"""

import libcst.matchers as m

from rlprobe_patch.codemod import (
    ANY,
    METHOD,
    AddMethods,
    ConfigPathParam,
    Hook,
    Where,
    assigns_call,
    first_returned,
    returns_tuple,
)


class Codemod(ConfigPathParam):
    DESCRIPTION = "msprobe dump hooks at the micro-batch boundaries of MegatronEngine's pipeline schedule"
    REQUIRES_MODULE_NAMES = ("os", "logger", "torch")
    OPERATIONS = (
        AddMethods("MegatronEngine"),
        Hook("MegatronEngine", "__init__", "init_debugger_state", Where.END, METHOD, expected="the method body"),
        Hook(
            "MegatronEngine", "forward_backward_batch", "decide_dump", Where.START, METHOD, expected="the method body"
        ),
        Hook(
            "MegatronEngine",
            "forward_backward_batch",
            "close_open_step",
            Where.AFTER,
            METHOD,
            anchor=assigns_call("losses_reduced", m.Call(func=m.Name("forward_backward_func"))),
            expected="`losses_reduced = forward_backward_func(...)` in the method body",
        ),
        Hook(
            "MegatronEngineWithLMHead",
            "forward_step",
            "start_micro_batch",
            Where.AFTER,
            METHOD,
            anchor=assigns_call("batch", m.Call(func=m.Name("next"), args=[m.Arg(m.Name("batch_iter"))])),
            expected="`batch: TensorDict = next(batch_iter)` in the method body",
        ),
        Hook(
            "MegatronEngineWithLMHead",
            "postprocess_micro_batch_func",
            "finish_after_loss",
            Where.BEFORE,
            ANY,
            anchor=returns_tuple(2),
            expected="`return <loss>, <output>` statements",
            many=True,
            template=lambda ret: {"loss": first_returned(ret)},
        ),
    )
