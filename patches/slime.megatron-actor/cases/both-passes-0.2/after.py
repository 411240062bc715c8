# Written for rlprobe-patch: the shape of slime 0.2.x's model.py (not slime's code).
import logging
import os
from functools import partial

import torch
from megatron.core import mpu
from megatron.core.pipeline_parallel import get_forward_backward_func

from .data import get_batch
from .loss import loss_function

logger = logging.getLogger(__name__)


@torch.no_grad()
def forward_only(f, args, model, data_iterator, num_microbatches, store_prefix=""):
    """Forward passes only."""
    _rlprobe_slime_dump.begin_pass(model, True, store_prefix, None, None)  # rlprobe-patch

    for iterator in data_iterator:
        iterator.reset()

    def forward_step(data_iterator, model, return_schedule_plan=False):
        """One micro-batch."""
        if _rlprobe_slime_dump.record:  # rlprobe-patch
            _rlprobe_slime_dump.start_micro_batch(model, data_iterator)
        batch = get_batch(data_iterator, ["tokens"], args.data_pad_size_multiplier, args.qkv_format)
        output_tensor = model(input_ids=batch["tokens"])
        return output_tensor, partial(f, args=args)

    forward_backward_func = get_forward_backward_func()
    forward_data_store = []
    for step_id in range(len(num_microbatches)):
        # collect_non_loss_data
        forward_data_store += forward_backward_func(
            forward_step_func=forward_step,
            data_iterator=data_iterator,
            model=model,
            num_microbatches=num_microbatches[step_id],
            forward_only=True,
            collect_non_loss_data=True,
        )
        if _rlprobe_slime_dump.record:  # rlprobe-patch
            _rlprobe_slime_dump.finish_step()
    return {f"{store_prefix}{key}": value for key, value in forward_data_store[0].items()}


def train_one_step(args, rollout_id, step_id, data_iterator, model, optimizer, opt_param_scheduler, num_microbatches):
    """One optimizer step."""
    _rlprobe_slime_dump.begin_pass(model, False, "", rollout_id, step_id)  # rlprobe-patch
    optimizer.zero_grad()

    def forward_step(data_iterator, model, return_schedule_plan=False):
        """One micro-batch."""
        if _rlprobe_slime_dump.record:  # rlprobe-patch
            _rlprobe_slime_dump.start_micro_batch(model, data_iterator)
        batch = get_batch(data_iterator, ["tokens", "loss_masks"], args.data_pad_size_multiplier, args.qkv_format)
        if os.environ.get("ENABLE_ROUTING_REPLAY", "0") == "1":
            os.environ["ROUTING_REPLAY_STAGE"] = "replay_forward"
        output_tensor = model(input_ids=batch["tokens"])
        if _rlprobe_slime_dump.record:  # rlprobe-patch
            _rlprobe_slime_dump.after_forward(output_tensor)
        return output_tensor, partial(loss_function, args, batch, num_microbatches)

    forward_backward_func = get_forward_backward_func()
    losses_reduced = forward_backward_func(
        forward_step_func=forward_step,
        data_iterator=data_iterator,
        model=model,
        num_microbatches=num_microbatches,
        forward_only=False,
    )
    if _rlprobe_slime_dump.record:  # rlprobe-patch
        _rlprobe_slime_dump.finish_step()
    optimizer.step()
    if mpu.is_pipeline_last_stage(ignore_virtual=True):
        return losses_reduced
    return {}


# Added by rlprobe-patch (slime.megatron-actor); `rlprobe-patch revert` removes it.
class _RlprobeSlimeDump:
    """One msprobe step per micro-batch of slime's Megatron passes (see the patch's payload.py)."""

    def __init__(self):
        self.debugger = None
        self.log_fp = None
        self.record = False  # decided once per pass
        self.forward_only = True
        self.phase = ""
        self.role = ""
        self.rollout_id = None
        self.train_step = None
        self.open_step = None  # the micro-batch whose step is open

    def begin_pass(self, model, forward_only, store_prefix, rollout_id, step_id):
        self.finish_step()
        self.record = False
        if not int(os.environ.get("DUMP_ON", "0")):
            return
        role = store_prefix.rstrip("_") or getattr(model[0], "role", "actor")
        if role == "actor":
            phase = "log_prob" if forward_only else "update_actor"
        else:
            phase = f"{role}_forward" if forward_only else f"update_{role}"
        wanted = [p.strip() for p in os.environ.get("DUMP_PHASE", "log_prob").split(",")]
        if phase not in wanted and not ("all" in wanted and role == "actor"):
            return
        self._ensure_debugger()
        self.record = self.debugger is not None
        self.forward_only, self.phase, self.role = forward_only, phase, role
        self.rollout_id, self.train_step = rollout_id, step_id

    def _ensure_debugger(self):
        # Lazy: nothing is imported or opened until DUMP_ON asks for it.
        if self.debugger is not None:
            return
        from msprobe.pytorch import PrecisionDebugger, seed_all

        seed_all(mode=True)
        self.debugger = PrecisionDebugger(config_path=os.environ.get("MSPROBE_ACTOR_CONFIG", "/home/config_actor.json"))
        try:
            log_dir = os.path.join(self.debugger.config.dump_path, str(os.getpid()))
            os.makedirs(log_dir, exist_ok=True)
            self.log_fp = open(os.path.join(log_dir, "update_actor_log.jsonl"), "a", encoding="utf-8")
        except Exception as exc:
            logger.warning(f"Failed to initialize update_actor_logger: {exc}")

    def start_micro_batch(self, model, data_iterator):
        # A step left open (a forward pass, or a pipeline stage that never sees the loss): close it.
        self.finish_step()
        while isinstance(getattr(model, "module", None), torch.nn.Module):
            model = model.module  # unwrap DDP / Float16Module
        self.open_step = self._samples_of(data_iterator)
        self.debugger.start(model=model)

    def _samples_of(self, data_iterator):
        # Read before get_batch advances the iterator: the samples this micro-batch is made of.
        info = {"sample_indices": [], "rollout_positions": []}
        try:
            it = data_iterator[0] if isinstance(data_iterator, (list, tuple)) else data_iterator
            if getattr(it, "micro_batch_indices", None) is not None:
                local = [int(i) for i in it.micro_batch_indices[it.offset]]
            else:  # fixed-size micro-batches (slime 0.2.x without dynamic batching): offset counts samples
                local = list(range(it.offset, it.offset + it.micro_batch_size))
            for key, name in (("sample_indices", "sample_indices"), ("partition", "rollout_positions")):
                values = it.rollout_data.get(key)
                if values is not None:
                    info[name] = [int(values[i]) for i in local]
        except Exception as exc:
            logger.warning(f"rlprobe-patch: cannot tell the samples of this micro-batch: {exc}")
        return info

    def after_forward(self, output_tensor):
        # Training: close the step once the backward through this micro-batch's output has finished.
        step = self.open_step
        if step is None or self.forward_only:
            return
        if not (isinstance(output_tensor, torch.Tensor) and output_tensor.requires_grad):
            return  # closed when the next micro-batch starts or the schedule returns

        def _finish_after_backward(grad):
            # The hook fires when the output's gradient is computed, during backward; the queued
            # callback runs once the whole backward pass has finished.
            torch.autograd.Variable._execution_engine.queue_callback(lambda: self.finish_step(step))
            return grad

        output_tensor.register_hook(_finish_after_backward)

    def finish_step(self, step=None):
        if self.open_step is None or (step is not None and step is not self.open_step):
            return
        info, self.open_step = self.open_step, None
        # Once msprobe has dumped every step its config asks for, it only has to be stopped.
        if not self.debugger.service.should_stop_service:
            self._log_step(info)
        self.debugger.stop()
        self.debugger.step()

    def _log_step(self, info):
        if self.log_fp is None:
            return
        import json
        import time

        ranks = {"dp_rank": None, "tp_rank": None, "pp_rank": None, "cp_rank": None}
        if mpu.model_parallel_is_initialized():
            ranks = {
                "dp_rank": mpu.get_data_parallel_rank(),
                "tp_rank": mpu.get_tensor_model_parallel_rank(),
                "pp_rank": mpu.get_pipeline_model_parallel_rank(),
                "cp_rank": mpu.get_context_parallel_rank(),
            }
        request_ids = [f"slime-{index}" for index in info["sample_indices"]]
        record = {
            "source": "update_actor",
            "framework": "slime",
            "phase": self.phase,
            "role": self.role,
            "timestamp": time.time(),
            "pid": os.getpid(),
            "rank": torch.distributed.get_rank() if torch.distributed.is_initialized() else 0,
            **ranks,
            "rollout_id": self.rollout_id,
            "train_step": self.train_step,
            "step": self.debugger.service.current_iter,
            "sample_indices": info["sample_indices"],
            "rollout_positions": info["rollout_positions"],
            "request_ids": request_ids,
            "num_requests": len(request_ids),
        }
        self.log_fp.write(json.dumps(record) + "\n")
        self.log_fp.flush()


_rlprobe_slime_dump = _RlprobeSlimeDump()
