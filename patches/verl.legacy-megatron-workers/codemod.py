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

`Hook(..., inner="forward_step")` places a hook in the function of that name defined inside
the method.
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

CLS = "MegatronPPOActor"


class Codemod(ConfigPathParam):
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
        Hook(
            CLS,
            "forward_backward_batch",
            "start_micro_batch",
            Where.AFTER,
            METHOD,
            anchor=assigns_call("batch", m.Call(func=m.Name("next"), args=[m.Arg(m.Name("batch_iter"))])),
            expected="`batch = next(batch_iter)` in the body of `forward_step`",
            inner="forward_step",
        ),
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
            inner="loss_func",
        ),
    )
