# Case (refused): verl 0.6.0 patched, then `self._debugger.step()` taken out of the inserted code by hand.
import logging
import os

logger = logging.getLogger(__file__)


class FSDPEngine:
    def __init__(self, engine_config):
        self.engine_config = engine_config
        self.rank = 0
        self._debugger = None  # rlprobe-patch
        self._update_actor_logger_fp = None

    def forward_backward_batch(self, data, loss_function, forward_only=False):
        micro_batches, indices = prepare_micro_batches(data=data)
        output_lst = []
        ctx = torch.no_grad() if forward_only else nullcontext()
        dump_this_call = self._should_dump(forward_only)  # rlprobe-patch
        for micro_batch in micro_batches:
            if dump_this_call:  # rlprobe-patch
                self._debugger.start(model=self.module)
            with ctx:
                loss, meta_info = self.forward_step(micro_batch, loss_function=loss_function, forward_only=forward_only)
                if not forward_only:
                    loss.backward()
            if dump_this_call:  # rlprobe-patch
                self._finish_dump_step(micro_batch)
            output_lst.append(meta_info)
        return postprocess_batch_func(output_lst=output_lst, indices=indices, data=data)

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
