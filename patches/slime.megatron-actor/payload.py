"""What `slime.megatron-actor` inserts into `slime/backends/megatron_utils/model.py`.

slime runs every actor pass through megatron-core's pipeline schedule from two module-level
functions: `forward_only` (log-prob passes of the actor, and of the reference and teacher
models, `store_prefix` "ref_" / "teacher_"; the critic's values) and `train_one_step` (one
optimizer step). Each defines a nested `forward_step` that takes its micro-batch with
`batch = get_batch(data_iterator, ...)`. The hooks mark the step boundaries as verl's Megatron
engine hook does: a step starts when `forward_step` is about to take its micro-batch (the
iterator still points at it, so its samples are known), and closes

- for forward passes, when the next micro-batch starts or the schedule returns (the step covers
  the forward and slime's post-forward function, e.g. the log-probs);
- for training, once the backward pass that flows through that micro-batch's output has
  finished (a hook on the output tensor queues a callback on autograd's engine).

The class and the instance below are appended to the module (`AddDefinitions`). Each
module-level function after them is a *statement hook*: its body (without the docstring) is
inserted at the place its docstring names; `codemod.py` finds those places.

Switches, all unset = the original behaviour with no import and no file work, read by the
shared switch reader (`patches/_shared/switches.py`, with slime's `DUMP_PHASE` from
`patches/_shared/slime_switches.py`) once per process, at the first pass:
`DUMP_ON` (`1`, `true`, `yes`, `on`); `DUMP_PHASE`, a comma-separated list: `log_prob` (default),
`update_actor`, `all` (both), and for the other models' passes, which are never dumped unless
named, `ref_forward`, `teacher_forward`, `critic_forward`, `update_critic`;
`MSPROBE_ACTOR_CONFIG` (default baked in by `apply --msprobe-config`). Any other value, or with
`DUMP_ON` on a config that is missing, not JSON or refused by msprobe, stops the run at the first
pass with an error naming the variable, before any step; rank 0 then logs one line (hooks
active, phase, config, dump path).

Device-agnostic: no accelerator call (the same code runs on CUDA, NPU or MUSA).

Each dumped step writes one `update_actor_log.jsonl` line (`<dump_path>/<pid>/`): phase, role,
rollout id and train step (training steps), msprobe step, global / dp / tp / pp / cp rank, the
micro-batch's `sample_indices` (slime's `Sample.index`), `rollout_positions` (`partition`, the
position in the rollout batch, where slime keeps it) and `request_ids`: the id
`slime.request-id` sends for each sample's first request, `slime-<index>`.
"""

import logging
import os

import torch
from _shared.slime_switches import SlimeSwitches
from _shared.switches import Switches
from megatron.core import mpu

# slime's model.py defines these names at module level.
logger = logging.getLogger(__name__)


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
        switches = self._rlprobe_run_switches()
        if not switches["dump_on"]:
            return
        # A wrong config stops the run at the first pass, dumped or not.
        self._ensure_debugger()
        role = store_prefix.rstrip("_") or getattr(model[0], "role", "actor")
        if role == "actor":
            phase = "log_prob" if forward_only else "update_actor"
        else:
            phase = f"{role}_forward" if forward_only else f"update_{role}"
        wanted = switches["phases"]
        if phase not in wanted and not ("all" in wanted and role == "actor"):
            return
        self.record = True
        self.forward_only, self.phase, self.role = forward_only, phase, role
        self.rollout_id, self.train_step = rollout_id, step_id

    def _ensure_debugger(self):
        # Lazy: nothing is imported or opened until DUMP_ON asks for it; a wrong config stops the
        # run here (patches/_shared/switches.py).
        if self.debugger is not None:
            return
        config_path = self._rlprobe_config_path("MSPROBE_ACTOR_CONFIG", "/home/config_actor.json")
        self.debugger = self._rlprobe_debugger("MSPROBE_ACTOR_CONFIG", config_path)
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else None
        self._rlprobe_announce("slime.megatron-actor r1", rank, config_path, self.debugger.config.dump_path)
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

    # The switch reader (patches/_shared/switches.py), with slime's DUMP_PHASE list.
    _rlprobe_on_rank = Switches._rlprobe_on_rank
    _rlprobe_switch = Switches._rlprobe_switch
    _rlprobe_switches = SlimeSwitches._rlprobe_switches
    _rlprobe_config_path = Switches._rlprobe_config_path
    _rlprobe_run_switches = Switches._rlprobe_run_switches
    _rlprobe_debugger = Switches._rlprobe_debugger
    _rlprobe_announce = Switches._rlprobe_announce


_rlprobe_slime_dump = _RlprobeSlimeDump()


def begin_forward_only(model, store_prefix):
    """First statement of `forward_only` (after its docstring)."""
    _rlprobe_slime_dump.begin_pass(model, True, store_prefix, None, None)  # rlprobe-patch


def begin_train_one_step(model, rollout_id, step_id):
    """First statement of `train_one_step` (after its docstring)."""
    _rlprobe_slime_dump.begin_pass(model, False, "", rollout_id, step_id)  # rlprobe-patch


def start_micro_batch(model, data_iterator):
    """Right before `batch = get_batch(...)` in the nested `forward_step` of both functions."""
    if _rlprobe_slime_dump.record:  # rlprobe-patch
        _rlprobe_slime_dump.start_micro_batch(model, data_iterator)


def finish_after_backward(output_tensor):
    """Right before `return output_tensor, partial(loss_function, ...)` in `train_one_step`'s `forward_step`."""
    if _rlprobe_slime_dump.record:  # rlprobe-patch
        _rlprobe_slime_dump.after_forward(output_tensor)


def close_open_step():
    """Right after each `forward_backward_func(...)` call of `forward_only` and `train_one_step`."""
    if _rlprobe_slime_dump.record:  # rlprobe-patch
        _rlprobe_slime_dump.finish_step()
