"""What `verl.legacy-fsdp-workers` inserts into `verl/workers/actor/dp_actor.py`.

On verl 0.6.x, and on 0.7.x unless `trainer.use_legacy_worker_impl=disable`, the PPO actor
runs through the legacy `fsdp_workers.ActorRolloutRefWorker`, which hands every log-prob
pass and every update to `DataParallelPPOActor` (`compute_log_prob`, `update_policy`). Both
loop over micro-batches, so the hooks are those of the FSDP engine patch, placed in these
two loops: one msprobe step per micro-batch, started at the top of the loop body and
closed at its end (after the forward, and for updates after the backward), with one
`update_actor_log.jsonl` line per step in the engine patch's format.

The methods of the class `DataParallelPPOActor` below are added verbatim to verl's
`DataParallelPPOActor`. Each module-level function is a *statement hook*: its body (without
the docstring) is inserted at the place its docstring names; `codemod.py` finds those places.

Switches, all unset = the original behaviour with no import and no file work:
`DUMP_ON=1`, `DUMP_PHASE` (`log_prob` default, `update_actor`, `all`),
`MSPROBE_ACTOR_CONFIG` (default baked in by `apply --msprobe-config`), `PROMPTS_ONLY=1`.
The reference policy (a `DataParallelPPOActor` without optimizer) never dumps, like the
engine patch's ref engine.

The helper methods the worker hooks share are written once, in `patches/_shared/worker_hooks.py`:
a line `name = Part.name` in the class takes one, verbatim, and the functions in capitals at
the end (`REQUEST_IDS`, `RANK`) fill its slots for this class.
"""


import torch
from _shared.switches import Switches
from _shared.worker_hooks import ActorDebugger, LoopSteps, PromptsOnly, UpdateActorLog


class DataParallelPPOActor:
    # Added by rlprobe-patch (verl.legacy-fsdp-workers); `rlprobe-patch revert` removes it.
    _ensure_debugger = ActorDebugger._ensure_debugger

    def _should_dump(self, forward_only):
        # Decided once per compute_log_prob / update_policy call: log-prob passes are forward-only.
        self._ensure_debugger()
        if getattr(self, "_debugger", None) is None:
            return False
        dump_phase = self._rlprobe_run_switches()["phase"]
        phase = "log_prob" if forward_only else "update_actor"
        return dump_phase in ("all", phase)

    _log_update_actor_step = UpdateActorLog._log_update_actor_step
    _finish_dump_step = LoopSteps._finish_dump_step

    def _dump_keys(self, data, non_tensor_keys, dump_this_call):
        # The request ids travel with the micro-batches only while this call dumps.
        if dump_this_call and "request_id" in data.non_tensor_batch and "request_id" not in non_tensor_keys:
            return [*non_tensor_keys, "request_id"]
        return non_tensor_keys

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
    """Appended to the end of `DataParallelPPOActor.__init__`."""
    self._debugger = None  # rlprobe-patch
    self._update_actor_logger_fp = None


def log_prob_prologue(self, data):
    """First statements of `DataParallelPPOActor.compute_log_prob` (after its docstring)."""
    data = self._prompts_only_batch(data)  # rlprobe-patch
    dump_this_call = self._should_dump(forward_only=True)


def update_prologue(self):
    """First statement of `DataParallelPPOActor.update_policy`."""
    dump_this_call = self._should_dump(forward_only=False)  # rlprobe-patch


def keep_request_ids(self, data, dump_this_call, non_tensor_keys):
    """Right before `data = data.select(..., non_tensor_batch_keys=<name>)` in both methods.

    `non_tensor_keys` stands for that name (`non_tensor_select_keys` in 0.6.0 to 0.7.1).
    """
    non_tensor_keys = self._dump_keys(data, non_tensor_keys, dump_this_call)  # rlprobe-patch


def start_micro_batch(self, dump_this_call):
    """First statement of the `for micro_batch in micro_batches:` loop body."""
    if dump_this_call:  # rlprobe-patch
        self._debugger.start(model=self.actor_module)


def finish_micro_batch(self, dump_this_call, micro_batch):
    """Last statement of the same loop body: after the forward (and the backward, in updates)."""
    if dump_this_call:  # rlprobe-patch
        self._finish_dump_step(micro_batch)


# Slots of UpdateActorLog._log_update_actor_step (patches/_shared/worker_hooks.py).
def REQUEST_IDS(micro_batch):
    """The micro-batch's request ids, or None."""
    # A DataProto micro-batch: the ids are in its non-tensor part (kept by `_dump_keys`).
    return getattr(micro_batch, "non_tensor_batch", {}).get("request_id", None)


def RANK():
    """The rank in the log line."""
    # DataParallelPPOActor has no self.rank.
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def PATCH():
    """The patch and revision in the line the hooks print when dumping is on."""
    return "verl.legacy-fsdp-workers r2"
