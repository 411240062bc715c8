"""Anchors of `verl.fsdp-engine` in `FSDPEngine` (verl/workers/engine/fsdp/transformer_impl.py).

The micro-batch loop of `forward_backward_batch` changed shape across releases; the anchors
below accept every form seen from 0.6.0 to 0.10.0.dev:

- the loop: `for micro_batch in micro_batches:` (<= 0.8.0) or
  `for micro_batch_idx, micro_batch in enumerate(micro_batches):` (>= 0.9.0);
- the `with` that runs forward and backward: 1 item (<= 0.8.0), `ctx, sync_ctx` (0.9.0),
  `ctx, sync_ctx, torch.profiler.record_function(...)` (0.9.1); recognised by the call to
  `self.forward_step(...)` inside it, whatever the backward looks like (bare
  `loss.backward()` or the `scaler` if/else of >= 0.8.0).
"""

import libcst as cst
import libcst.matchers as m

from rlprobe_patch.codemod import (
    METHOD,
    AddMethods,
    ConfigPathParam,
    Hook,
    Where,
    contains,
    self_call,
)

MICRO_BATCH_LOOP = m.For(
    iter=m.Name("micro_batches") | m.Call(func=m.Name("enumerate"), args=[m.Arg(m.Name("micro_batches"))])
)


def is_micro_batch_loop(stmt: cst.BaseStatement) -> bool:
    return m.matches(stmt, MICRO_BATCH_LOOP)


def is_forward_backward_with(stmt: cst.BaseStatement) -> bool:
    return m.matches(stmt, m.With()) and contains(stmt, self_call("forward_step"))


class Codemod(ConfigPathParam):
    DESCRIPTION = "msprobe dump hooks around each micro-batch of FSDPEngine.forward_backward_batch"
    REQUIRES_MODULE_NAMES = ("os", "logger")
    OPERATIONS = (
        AddMethods("FSDPEngine"),
        Hook("FSDPEngine", "__init__", "init_debugger_state", Where.END, METHOD, expected="the method body"),
        Hook(
            "FSDPEngine",
            "forward_backward_batch",
            "decide_dump",
            Where.BEFORE,
            METHOD,
            anchor=is_micro_batch_loop,
            expected="`for ... in micro_batches:` (or `enumerate(micro_batches)`) in the method body",
        ),
        Hook(
            "FSDPEngine",
            "forward_backward_batch",
            "start_micro_batch",
            Where.START,
            block=is_micro_batch_loop,
            expected="one micro-batch loop",
        ),
        Hook(
            "FSDPEngine",
            "forward_backward_batch",
            "finish_micro_batch",
            Where.AFTER,
            block=is_micro_batch_loop,
            anchor=is_forward_backward_with,
            expected="a `with` block calling `self.forward_step(...)` in the micro-batch loop",
        ),
    )
