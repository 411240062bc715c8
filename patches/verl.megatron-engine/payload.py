"""What `verl.megatron-engine` inserts into `verl/workers/engine/megatron/transformer_impl.py`.

Megatron runs micro-batches through its own pipeline schedule, so there is no loop to wrap.
The hooks mark the step boundaries instead: a step starts when `forward_step` takes its
micro-batch from the iterator, and closes when the loss of that micro-batch is ready
(forward-only calls) or when the backward that starts from that loss has finished
(training calls, through a callback queued on autograd's engine).

The methods of the class `MegatronEngine` below are added verbatim to verl's
`MegatronEngine`. Each module-level function is a *statement hook*: its body (without the
docstring) is inserted at the place its docstring names; `codemod.py` finds those places.

Switches, all unset = the original behaviour with no import and no file work:
`DUMP_ON=1`, `DUMP_PHASE` (`log_prob` default, `update_actor`, `all`),
`MSPROBE_ACTOR_CONFIG` (default baked in by `apply --msprobe-config`).

Unlike the skill's design, the phase is the one of the current call (`forward_only`), so the
default `DUMP_PHASE=log_prob` dumps the log-prob pass instead of nothing.

The helper methods the worker hooks share are written once, in `patches/_shared/worker_hooks.py`:
a line `name = Part.name` in the class takes one, verbatim, and the functions in capitals at
the end (`REQUEST_IDS`, `RANK`) fill its slots for this class.
"""

import torch
from _shared.switches import Switches
from _shared.worker_hooks import EngineDebugger, PipelineSteps


class MegatronEngine:
    # Added by rlprobe-patch (verl.megatron-engine); `rlprobe-patch revert` removes it.
    _ensure_debugger = EngineDebugger._ensure_debugger
    _should_dump = PipelineSteps._should_dump
    _log_update_actor_step = PipelineSteps._log_update_actor_step
    _start_dump_step = PipelineSteps._start_dump_step
    _open_dump_step = PipelineSteps._open_dump_step
    _dump_after_loss = PipelineSteps._dump_after_loss
    _dump_backward_begins = PipelineSteps._dump_backward_begins
    _finish_dump_step = PipelineSteps._finish_dump_step

    # The switch reader (patches/_shared/switches.py).
    _rlprobe_on_rank = Switches._rlprobe_on_rank
    _rlprobe_switch = Switches._rlprobe_switch
    _rlprobe_switches = Switches._rlprobe_switches
    _rlprobe_config_path = Switches._rlprobe_config_path
    _rlprobe_run_switches = Switches._rlprobe_run_switches
    _rlprobe_debugger = Switches._rlprobe_debugger
    _rlprobe_announce = Switches._rlprobe_announce


def init_debugger_state(self):
    """Appended to the end of `MegatronEngine.__init__`."""
    self._debugger = None  # rlprobe-patch
    self._update_actor_logger_fp = None
    self._dump_should_record = False
    self._dump_micro_batch = None


def decide_dump(self, forward_only):
    """First statement of `MegatronEngine.forward_backward_batch`."""
    self._dump_should_record = self._should_dump(forward_only)  # rlprobe-patch


def close_open_step(self):
    """Right after `losses_reduced = forward_backward_func(...)` in `forward_backward_batch`."""
    if self._dump_should_record:  # rlprobe-patch
        self._finish_dump_step()


def start_micro_batch(self, model, batch):
    """Right after `batch = next(batch_iter)` in `MegatronEngineWithLMHead.forward_step`."""
    if self._dump_should_record:  # rlprobe-patch
        self._start_dump_step(model, batch)


def finish_after_loss(self, loss, forward_only):
    """Before each `return <loss>, ...` of `MegatronEngineWithLMHead.postprocess_micro_batch_func`.

    `loss` stands for the first element of that return: `loss` on 0.6.x, `scaled_loss` from
    0.7.0, `local_sum` in the per-token-loss return of 0.9.0 and later.
    """
    if self._dump_should_record:  # rlprobe-patch
        self._dump_after_loss(loss, forward_only)


# Slots of PipelineSteps._log_update_actor_step (patches/_shared/worker_hooks.py).
def REQUEST_IDS(micro_batch):
    """The micro-batch's request ids, or None."""
    return micro_batch.get("request_id", None) if "request_id" in micro_batch.keys() else None


def RANK():
    """The rank in the log line."""
    # MegatronEngine has no self.rank.
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def PATCH():
    """The patch and revision in the line the hooks print when dumping is on."""
    return "verl.megatron-engine r2"
