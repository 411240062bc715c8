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
"""

import logging
import os

import torch

# verl's transformer_impl.py defines these names at module level.
logger = logging.getLogger(__file__)


class MegatronEngine:
    # Added by rlprobe-patch (verl.megatron-engine); `rlprobe-patch revert` removes it.
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
            # MegatronEngine has no self.rank.
            "rank": torch.distributed.get_rank() if torch.distributed.is_initialized() else 0,
            "step": self._debugger.service.current_iter,
            "request_ids": request_ids,
            "num_requests": len(request_ids),
        }
        self._update_actor_logger_fp.write(json.dumps(record) + "\n")
        self._update_actor_logger_fp.flush()

    def _start_dump_step(self, model, batch):
        if getattr(self, "_dump_micro_batch", None) is not None:
            # A step left open (a pipeline stage that never sees the loss): close it first.
            self._finish_dump_step()
        while isinstance(getattr(model, "module", None), torch.nn.Module):
            model = model.module  # unwrap DDP / Float16Module, as verl's unwrap_model does
        self._dump_micro_batch = batch
        self._debugger.start(model=model)

    def _dump_after_loss(self, loss, forward_only):
        if getattr(self, "_dump_micro_batch", None) is None:
            return
        if forward_only or not (isinstance(loss, torch.Tensor) and loss.requires_grad):
            self._finish_dump_step()
            return

        def _finish_after_backward(grad):
            # The hook fires when the loss's gradient is computed, at the start of backward;
            # the queued callback runs once the whole backward pass has finished.
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_dump_step)
            return grad

        loss.register_hook(_finish_after_backward)

    def _finish_dump_step(self):
        if getattr(self, "_dump_micro_batch", None) is None:
            return
        micro_batch, self._dump_micro_batch = self._dump_micro_batch, None
        # Once msprobe has dumped every step its config asks for, it only has to be stopped.
        if not self._debugger.service.should_stop_service:
            self._log_update_actor_step(micro_batch)
        self._debugger.stop()
        self._debugger.step()


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
