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
"""

import logging
import os

# verl's transformer_impl.py defines both names at module level; they are here so that this
# file can be linted and executed on its own.
logger = logging.getLogger(__file__)


class FSDPEngine:
    # Added by rlprobe-patch (verl.fsdp-engine); `rlprobe-patch revert` removes it.
    def _ensure_debugger(self):
        # Lazy: nothing is imported or opened until DUMP_ON asks for it.
        if getattr(self, "_debugger", None) is not None or self.engine_config.forward_only:
            return
        if not int(os.environ.get("DUMP_ON", "0")):
            return
        from msprobe.pytorch import PrecisionDebugger, seed_all

        seed_all(mode=True)
        self._debugger = PrecisionDebugger(
            config_path=os.environ.get("MSPROBE_ACTOR_CONFIG", "/home/config_actor.json")
        )
        try:
            log_dir = os.path.join(self._debugger.config.dump_path, str(os.getpid()))
            os.makedirs(log_dir, exist_ok=True)
            self._update_actor_logger_fp = open(os.path.join(log_dir, "update_actor_log.jsonl"), "a", encoding="utf-8")
        except Exception as exc:
            logger.warning(f"Failed to initialize update_actor_logger: {exc}")

    def _should_dump(self, forward_only):
        # Decided once per forward_backward_batch call: forward-only calls are log-prob passes.
        self._ensure_debugger()
        if getattr(self, "_debugger", None) is None:
            return False
        dump_phase = os.environ.get("DUMP_PHASE", "log_prob")
        phase = "log_prob" if forward_only else "update_actor"
        return dump_phase in ("all", phase)

    def _log_update_actor_step(self, micro_batch):
        if getattr(self, "_update_actor_logger_fp", None) is None:
            return
        import json
        import time

        request_ids = micro_batch.get("request_id", None) if "request_id" in micro_batch.keys() else None
        if request_ids is None:
            request_ids = []
        elif hasattr(request_ids, "tolist"):
            request_ids = request_ids.tolist()
        request_ids = [str(request_id) for request_id in request_ids]
        record = {
            "source": "update_actor",
            "timestamp": time.time(),
            "pid": os.getpid(),
            "rank": self.rank,
            "step": self._debugger.service.current_iter,
            "request_ids": request_ids,
            "num_requests": len(request_ids),
        }
        self._update_actor_logger_fp.write(json.dumps(record) + "\n")
        self._update_actor_logger_fp.flush()

    def _finish_dump_step(self, micro_batch):
        # Once msprobe has dumped every step its config asks for, it only has to be stopped.
        if not self._debugger.service.should_stop_service:
            self._log_update_actor_step(micro_batch)
        self._debugger.stop()
        self._debugger.step()


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
