"""Anchors of `slime.megatron-actor` (slime/backends/megatron_utils/model.py).

The same shape in every release 0.2.2 to 0.3.1 (the signatures around it moved: `f` and
`use_rollout_top_p_replay` of `forward_only`, `step_global_batch_size` and `microbatch_pbar`
of `train_one_step`; the anchors ignore them):

- module level: `os`, `torch`, `mpu` (`from megatron.core import mpu`) and `logger`;
- `forward_only(f, args, model, data_iterator, num_microbatches, store_prefix="", ...)` with a
  docstring, a nested `forward_step(data_iterator, model, return_schedule_plan=False)` whose
  micro-batch is taken by `batch = get_batch(data_iterator, ...)`, and
  `forward_data_store += forward_backward_func(...)` in a `for step_id in ...` loop;
- `train_one_step(args, rollout_id, step_id, data_iterator, model, ...)` with a docstring, a
  nested `forward_step` with `batch = get_batch(...)` and one
  `return output_tensor, partial(loss_function, ...)`, and
  `losses_reduced = forward_backward_func(...)`.

`Hook(None, "forward_only", ..., inner="forward_step")` places a hook in the function of that
name defined inside the module-level function.
"""

import libcst.matchers as m

from rlprobe_patch.codemod import ANY, METHOD, AddDefinitions, ConfigPathParam, Hook, Where, assigns_call

TAKES_MICRO_BATCH = assigns_call("batch", m.Call(func=m.Name("get_batch")))


def _adds_forward_data(stmt) -> bool:
    """`forward_data_store += forward_backward_func(...)`."""
    call = m.Call(func=m.Name("forward_backward_func"))
    return m.matches(stmt, m.SimpleStatementLine(body=[m.AugAssign(target=m.Name("forward_data_store"), value=call)]))


def _returns_training_loss(stmt) -> bool:
    """`return output_tensor, partial(loss_function, ...)`."""
    loss = m.Call(func=m.Name("partial"), args=[m.Arg(m.Name("loss_function")), m.ZeroOrMore()])
    returned = m.Tuple(elements=[m.Element(m.Name("output_tensor")), m.Element(loss)])
    return m.matches(stmt, m.SimpleStatementLine(body=[m.Return(value=returned)]))


class Codemod(ConfigPathParam):
    DESCRIPTION = "msprobe dump hooks at the micro-batch boundaries of slime's Megatron forward_only / train_one_step"
    REQUIRES_MODULE_NAMES = ("os", "torch", "mpu", "logger")
    OPERATIONS = (
        AddDefinitions(("_RlprobeSlimeDump", "_rlprobe_slime_dump")),
        Hook(None, "forward_only", "begin_forward_only", Where.START, METHOD, expected="the function body"),
        Hook(
            None,
            "forward_only",
            "start_micro_batch",
            Where.BEFORE,
            METHOD,
            anchor=TAKES_MICRO_BATCH,
            expected="`batch = get_batch(...)` in the body of `forward_step`",
            inner="forward_step",
        ),
        Hook(
            None,
            "forward_only",
            "close_open_step",
            Where.AFTER,
            ANY,
            anchor=_adds_forward_data,
            expected="`forward_data_store += forward_backward_func(...)`",
        ),
        Hook(None, "train_one_step", "begin_train_one_step", Where.START, METHOD, expected="the function body"),
        Hook(
            None,
            "train_one_step",
            "start_micro_batch",
            Where.BEFORE,
            METHOD,
            anchor=TAKES_MICRO_BATCH,
            expected="`batch = get_batch(...)` in the body of `forward_step`",
            inner="forward_step",
        ),
        Hook(
            None,
            "train_one_step",
            "finish_after_backward",
            Where.BEFORE,
            METHOD,
            anchor=_returns_training_loss,
            expected="`return output_tensor, partial(loss_function, ...)` in the body of `forward_step`",
            inner="forward_step",
        ),
        Hook(
            None,
            "train_one_step",
            "close_open_step",
            Where.AFTER,
            METHOD,
            anchor=assigns_call("losses_reduced", m.Call(func=m.Name("forward_backward_func"))),
            expected="`losses_reduced = forward_backward_func(...)` in the function body",
        ),
    )
