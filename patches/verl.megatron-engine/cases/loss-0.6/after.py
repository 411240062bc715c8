# Case: verl 0.6.0's Megatron engine (loss scaled in place, `return loss, output`).
import logging
import os

import torch

logger = logging.getLogger(__file__)


class MegatronEngine:
    def __init__(self, engine_config):
        self.engine_config = engine_config
        self.weight_converter = None
        self._debugger = None  # rlprobe-patch
        self._update_actor_logger_fp = None
        self._dump_should_record = False
        self._dump_micro_batch = None

    def forward_backward_batch(self, data, loss_function, forward_only=False):
        self._dump_should_record = self._should_dump(forward_only)  # rlprobe-patch
        forward_backward_func = get_forward_backward_func()
        losses_reduced = forward_backward_func(forward_step_func=self.forward_step, forward_only=forward_only)
        if self._dump_should_record:  # rlprobe-patch
            self._finish_dump_step()
        return losses_reduced

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


class MegatronEngineWithLMHead(MegatronEngine):
    def forward_step(self, batch_iter, model, postprocess_micro_batch_func):
        batch: TensorDict = next(batch_iter)
        if self._dump_should_record:  # rlprobe-patch
            self._start_dump_step(model, batch)
        batch = batch.to(get_device_id())
        output = model(batch)
        return output, partial(postprocess_micro_batch_func, data=batch)

    def postprocess_micro_batch_func(self, output, data, forward_only, loss_function):
        if loss_function is not None:
            loss, metrics = loss_function(model_output=output, data=data)
            loss = loss * data["num_micro_batch"] / mpu.get_context_parallel_world_size()
        else:
            loss = torch.tensor(1.0)
        if self._dump_should_record:  # rlprobe-patch
            self._dump_after_loss(loss, forward_only)
        return loss, {"loss": loss}
