"""What `verl.fsdp-engine` inserts into `verl/workers/engine/fsdp/transformer_impl.py`.

The methods of the class `FSDPEngine` below are added, verbatim, to verl's `FSDPEngine`.
Each module-level function below is a *statement hook*: its body (without the docstring)
is inserted at the place its docstring names. The codemod in `codemod.py` says how those
places are found on each verl release.

Everything is switched by environment variables and does nothing when they are unset:
no import, no file, one local boolean per `forward_backward_batch` call.

- `DUMP_ON=1` turns the debugger on (the ref engine, `engine_config.forward_only`, never dumps).
- `DUMP_PHASE` = `log_prob` (default: forward-only calls), `update_actor` (training calls) or `all`.
- `MSPROBE_ACTOR_CONFIG` is the msprobe config.json; `apply --msprobe-config` changes the default.

One msprobe step is one micro-batch: started at the top of the loop body, closed after the
forward and the backward, with one `update_actor_log.jsonl` line per step.

The helper methods the worker hooks share are written once, in `patches/_shared/worker_hooks.py`:
a line `name = Part.name` in the class takes one, verbatim, and the functions in capitals at
the end (`REQUEST_IDS`, `RANK`) fill its slots for this class.
"""

from _shared.switches import Switches
from _shared.worker_hooks import DumpPhase, EngineDebugger, LoopSteps, UpdateActorLog


class FSDPEngine:
    # Added by rlprobe-patch (verl.fsdp-engine); `rlprobe-patch revert` removes it.
    _ensure_debugger = EngineDebugger._ensure_debugger
    _should_dump = DumpPhase._should_dump
    _log_update_actor_step = UpdateActorLog._log_update_actor_step
    _finish_dump_step = LoopSteps._finish_dump_step

    # The switch reader (patches/_shared/switches.py).
    _rlprobe_on_rank = Switches._rlprobe_on_rank
    _rlprobe_switch = Switches._rlprobe_switch
    _rlprobe_switches = Switches._rlprobe_switches
    _rlprobe_config_path = Switches._rlprobe_config_path
    _rlprobe_run_switches = Switches._rlprobe_run_switches
    _rlprobe_debugger = Switches._rlprobe_debugger
    _rlprobe_announce = Switches._rlprobe_announce


def init_debugger_state(self):
    """Appended to the end of `FSDPEngine.__init__`."""
    self._debugger = None  # rlprobe-patch
    self._update_actor_logger_fp = None


def decide_dump(self, forward_only):
    """Inserted just before the micro-batch loop of `FSDPEngine.forward_backward_batch`."""
    dump_this_call = self._should_dump(forward_only)  # rlprobe-patch


def start_micro_batch(self, dump_this_call):
    """Inserted as the first statement of the micro-batch loop body."""
    if dump_this_call:  # rlprobe-patch
        self._debugger.start(model=self.module)


def finish_micro_batch(self, dump_this_call, micro_batch):
    """Inserted right after the `with` block that runs forward and backward, inside the loop."""
    if dump_this_call:  # rlprobe-patch
        self._finish_dump_step(micro_batch)


# Slots of UpdateActorLog._log_update_actor_step (patches/_shared/worker_hooks.py).
def REQUEST_IDS(micro_batch):
    """The micro-batch's request ids, or None."""
    return micro_batch.get("request_id", None) if "request_id" in micro_batch.keys() else None


def RANK(self):
    """The rank in the log line."""
    return self.rank


def PATCH():
    """The patch and revision in the line the hooks print when dumping is on."""
    return "verl.fsdp-engine r2"
