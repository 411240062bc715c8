"""Anchors of `verl.legacy-megatron-workers` in `MegatronPPOActor` (verl/workers/actor/megatron_actor.py).

The legacy Megatron worker (`megatron_workers.ActorRolloutRefWorker`) runs every actor log-prob
pass and update through `MegatronPPOActor.forward_backward_batch`. The same shape in every
release 0.6.0 to 0.7.1:

- `compute_log_prob(self, data, calculate_entropy=False)` with a docstring;
- `forward_backward_batch(self, data, forward_only=False, ...)` with a docstring, two
  `losses_reduced = forward_backward_func(...)` calls (the PP>1 and PP=1 branches), and two
  nested closures:
  - `def forward_step(batch_iter, model)` (0.6.1+ adds `return_schedule_plan`), whose
    `batch = next(batch_iter)` is where a micro-batch is taken (0.6.0+ then moves it with
    `batch = batch.to(get_device_id())`);
  - `def loss_func(output, data, meta_info)`, with two `return <loss>, <stats>` statements
    (the early forward-only one returns the constant `torch.tensor(1.0, device=device)`).

The toolkit's `Hook` does not enter nested functions; `NestedHook` (below) does, for one
function defined inside the method.
"""

from dataclasses import dataclass, replace

import libcst as cst
import libcst.matchers as m

from rlprobe_patch.codemod import (
    ANY,
    METHOD,
    AddMethods,
    AnchorError,
    ConfigPathParam,
    Hook,
    Where,
    assigns_call,
    first_returned,
    returns_tuple,
)


@dataclass(frozen=True)
class NestedHook:
    """A `Hook` placed in the function `inner` defined (once) inside `hook.cls`.`hook.method`.

    (A plain class body: this module is loaded from a file path, where `from __future__ import
    annotations` would make `dataclass` look the module up in `sys.modules`.)
    """

    hook: Hook
    inner: str


class NestedHookCodemod(ConfigPathParam):
    """`ConfigPathParam` plus `NestedHook` operations (a candidate for the toolkit)."""

    def _apply(self, module, op, params, strip):  # type: ignore[override]
        if not isinstance(op, NestedHook):
            return super()._apply(module, op, params, strip)
        inner_op = replace(op.hook, method=f"{op.hook.method}.<locals>.{op.inner}")

        def edit_outer(outer: cst.FunctionDef) -> cst.FunctionDef:
            found = m.findall(outer.body, m.FunctionDef(name=m.Name(op.inner)))
            if len(found) != 1:
                raise AnchorError(
                    f"{self.target}: {op.hook.cls}.{op.hook.method}",
                    f"one nested function `{op.inner}`",
                    f"{len(found)} such functions",
                )
            inner = found[0]
            assert isinstance(inner, cst.FunctionDef)
            return outer.deep_replace(inner, self._hook(inner, inner_op, params, strip))  # type: ignore[return-value]

        assert op.hook.cls is not None
        return self._edit_class(module, op.hook.cls, lambda cls: self._edit_method(cls, op.hook, edit_outer))


CLS = "MegatronPPOActor"


class Codemod(NestedHookCodemod):
    DESCRIPTION = "msprobe dump hooks at the micro-batch boundaries of the legacy Megatron actor (MegatronPPOActor)"
    REQUIRES_MODULE_NAMES = ("os", "logger", "torch")
    OPERATIONS = (
        AddMethods(CLS),
        Hook(CLS, "__init__", "init_debugger_state", Where.END, METHOD, expected="the method body"),
        Hook(CLS, "compute_log_prob", "log_prob_prologue", Where.START, METHOD, expected="the method body"),
        Hook(CLS, "forward_backward_batch", "decide_dump", Where.START, METHOD, expected="the method body"),
        Hook(
            CLS,
            "forward_backward_batch",
            "close_open_step",
            Where.AFTER,
            ANY,
            anchor=assigns_call("losses_reduced", m.Call(func=m.Name("forward_backward_func"))),
            expected="`losses_reduced = forward_backward_func(...)` statements",
            many=True,
        ),
        NestedHook(
            Hook(
                CLS,
                "forward_backward_batch",
                "start_micro_batch",
                Where.AFTER,
                METHOD,
                anchor=assigns_call("batch", m.Call(func=m.Name("next"), args=[m.Arg(m.Name("batch_iter"))])),
                expected="`batch = next(batch_iter)` in the body of `forward_step`",
            ),
            inner="forward_step",
        ),
        NestedHook(
            Hook(
                CLS,
                "forward_backward_batch",
                "finish_after_loss",
                Where.BEFORE,
                ANY,
                anchor=returns_tuple(2),
                expected="`return <loss>, <stats>` statements in `loss_func`",
                many=True,
                template=lambda ret: {"loss": first_returned(ret)},
            ),
            inner="loss_func",
        ),
    )
