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
"""

import logging
import os

import torch

# verl's dp_actor.py defines these names at module level.
logger = logging.getLogger(__file__)


class DataParallelPPOActor:
    # Added by rlprobe-patch (verl.legacy-fsdp-workers); `rlprobe-patch revert` removes it.
    def _ensure_debugger(self):
        # Lazy: nothing is imported or opened until DUMP_ON asks for it; the ref policy never dumps.
        if getattr(self, "_debugger", None) is not None or self.actor_optimizer is None:
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
        # Decided once per compute_log_prob / update_policy call: log-prob passes are forward-only.
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

        # A DataProto micro-batch: the ids are in its non-tensor part (kept by `_dump_keys`).
        request_ids = getattr(micro_batch, "non_tensor_batch", {}).get("request_id", None)
        if request_ids is None:
            request_ids = []
        elif hasattr(request_ids, "tolist"):
            request_ids = request_ids.tolist()
        request_ids = [str(request_id) for request_id in request_ids]
        record = {
            "source": "update_actor",
            "timestamp": time.time(),
            "pid": os.getpid(),
            # DataParallelPPOActor has no self.rank.
            "rank": torch.distributed.get_rank() if torch.distributed.is_initialized() else 0,
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

    def _dump_keys(self, data, non_tensor_keys, dump_this_call):
        # The request ids travel with the micro-batches only while this call dumps.
        if dump_this_call and "request_id" in data.non_tensor_batch and "request_id" not in non_tensor_keys:
            return [*non_tensor_keys, "request_id"]
        return non_tensor_keys

    def _prompts_only_batch(self, data):
        # PROMPTS_ONLY=1: the log-prob pass covers the prompts only, like the rollout engine's
        # prefill. A batch the trainer already cut (verl.prompts-only) has width-0 responses
        # and is returned as it is.
        if not int(os.environ.get("PROMPTS_ONLY", "0")):
            return data
        batch = data.batch
        if batch is None or "responses" not in batch.keys() or batch["responses"].size(1) == 0:
            return data
        responses_len = batch["responses"].size(1)
        trimmed = batch.clone(recurse=False)
        for key in ("input_ids", "attention_mask", "position_ids"):
            if key in batch.keys():
                # 2-D (bs, seq) or 3-D (bs, 3, seq) position_ids: the sequence is the last axis.
                trimmed[key] = batch[key][..., :-responses_len]
        for key in ("responses", "rollout_log_probs", "response_mask"):
            if key in batch.keys():
                trimmed[key] = batch[key][:, :0]
        return type(data)(batch=trimmed, non_tensor_batch=data.non_tensor_batch, meta_info=data.meta_info)


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
