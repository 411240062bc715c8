"""What `verl.legacy-megatron-workers` inserts into `verl/workers/actor/megatron_actor.py`.

On verl 0.6.x, and on 0.7.x unless `trainer.use_legacy_worker_impl=disable`, the PPO actor
runs through the legacy `megatron_workers.ActorRolloutRefWorker`, which hands every log-prob
pass and every update to `MegatronPPOActor.forward_backward_batch`. That method runs the
micro-batches through Megatron's pipeline schedule with two nested closures, `forward_step`
(takes the micro-batch from the iterator) and `loss_func` (turns the output into the loss),
so the hooks mark the step boundaries as the Megatron engine patch does: a step starts when
`forward_step` takes its micro-batch, and closes when `loss_func` has the loss (log-prob
passes) or when the backward that starts from that loss has finished (updates, through a
callback queued on autograd's engine). One `update_actor_log.jsonl` line per step, in the
engine patch's format.

The methods of the class `MegatronPPOActor` below are added verbatim to verl's
`MegatronPPOActor`. Each module-level function is a *statement hook*: its body (without the
docstring) is inserted at the place its docstring names; `codemod.py` finds those places.

Switches, all unset = the original behaviour with no import and no file work:
`DUMP_ON=1`, `DUMP_PHASE` (`log_prob` default, `update_actor`, `all`),
`MSPROBE_ACTOR_CONFIG` (default baked in by `apply --msprobe-config`), `PROMPTS_ONLY=1`.
The reference policy (a `MegatronPPOActor` without optimizer) never dumps.

The helper methods the worker hooks share are written once, in `patches/_shared/worker_hooks.py`:
a line `name = Part.name` in the class takes one, verbatim, and the functions in capitals at
the end (`REQUEST_IDS`, `RANK`) fill its slots for this class.
"""

import torch
from _shared.switches import Switches
from _shared.worker_hooks import ActorDebugger, PipelineSteps, PromptsOnly


class MegatronPPOActor:
    # Added by rlprobe-patch (verl.legacy-megatron-workers); `rlprobe-patch revert` removes it.
    _ensure_debugger = ActorDebugger._ensure_debugger
    _should_dump = PipelineSteps._should_dump
    _log_update_actor_step = PipelineSteps._log_update_actor_step
    _start_dump_step = PipelineSteps._start_dump_step
    _open_dump_step = PipelineSteps._open_dump_step
    _dump_after_loss = PipelineSteps._dump_after_loss
    _dump_backward_begins = PipelineSteps._dump_backward_begins
    _finish_dump_step = PipelineSteps._finish_dump_step
    _prompts_only_batch = PromptsOnly._prompts_only_batch

    # The switch reader (patches/_shared/switches.py).
    _rlprobe_on_rank = Switches._rlprobe_on_rank
    _rlprobe_switch = Switches._rlprobe_switch
    _rlprobe_switches = Switches._rlprobe_switches
    _rlprobe_config_path = Switches._rlprobe_config_path
    _rlprobe_run_switches = Switches._rlprobe_run_switches
    _rlprobe_debugger = Switches._rlprobe_debugger
    _rlprobe_announce = Switches._rlprobe_announce


def init_debugger_state(self):
    """Appended to the end of `MegatronPPOActor.__init__`."""
    self._debugger = None  # rlprobe-patch
    self._update_actor_logger_fp = None
    self._dump_should_record = False
    self._dump_micro_batch = None


def log_prob_prologue(self, data):
    """First statement of `MegatronPPOActor.compute_log_prob` (after its docstring)."""
    data = self._prompts_only_batch(data)  # rlprobe-patch


def decide_dump(self, forward_only):
    """First statement of `MegatronPPOActor.forward_backward_batch` (after its docstring)."""
    self._dump_should_record = self._should_dump(forward_only)  # rlprobe-patch


def close_open_step(self):
    """Right after each `losses_reduced = forward_backward_func(...)` of `forward_backward_batch`."""
    if self._dump_should_record:  # rlprobe-patch
        self._finish_dump_step()


def start_micro_batch(self, model, batch):
    """Right after `batch = next(batch_iter)` in the nested `forward_step` of `forward_backward_batch`."""
    if self._dump_should_record:  # rlprobe-patch
        self._start_dump_step(model, batch)


def finish_after_loss(self, loss, forward_only):
    """Before each `return <loss>, ...` of the nested `loss_func` of `forward_backward_batch`.

    `loss` stands for the first element of that return: `policy_loss`, or the constant
    `torch.tensor(1.0, device=device)` of the early forward-only return.
    """
    if self._dump_should_record:  # rlprobe-patch
        self._dump_after_loss(loss, forward_only)


# Slots of PipelineSteps._log_update_actor_step (patches/_shared/worker_hooks.py).
def REQUEST_IDS(micro_batch):
    """The micro-batch's request ids, or None."""
    # A TensorDict micro-batch: request ids only when the batch carries them.
    return micro_batch.get("request_id", None) if "request_id" in micro_batch.keys() else None


def RANK():
    """The rank in the log line."""
    # MegatronPPOActor has no self.rank.
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def PATCH():
    """The patch and revision in the line the hooks print when dumping is on."""
    return "verl.legacy-megatron-workers r2"
