# Written for rlprobe-patch: the shape of slime 0.3.x's model.py (not slime's code).
import logging
import os
from functools import partial

import torch
from megatron.core import mpu
from megatron.core.pipeline_parallel import get_forward_backward_func

from .data import get_batch
from .loss import loss_function

logger = logging.getLogger(__name__)


def _wrap(forward_step_func, pbar):
    return forward_step_func


@torch.no_grad()
def forward_only(f, args, model, data_iterator, num_microbatches, store_prefix="", use_rollout_top_p_replay=False):
    """Forward passes only."""
    _rlprobe_slime_dump.begin_pass(model, True, store_prefix, None, None)  # rlprobe-patch
    batch_keys = ["tokens", "loss_masks"]

    def forward_step(data_iterator, model, return_schedule_plan=False):
        """One micro-batch."""
        assert not return_schedule_plan
        if _rlprobe_slime_dump.record:  # rlprobe-patch
            _rlprobe_slime_dump.start_micro_batch(model, data_iterator)
        batch = get_batch(data_iterator, batch_keys, args.data_pad_size_multiplier, args.allgather_cp)
        output_tensor = model(input_ids=batch["tokens"])
        output_kwargs = {"args": args}
        return output_tensor, partial(f, **output_kwargs)

    forward_backward_func = get_forward_backward_func()
    forward_data_store = []
    pbar = None
    for step_id in range(len(num_microbatches)):
        forward_data_store += forward_backward_func(
            forward_step_func=_wrap(forward_step, pbar),
            data_iterator=data_iterator,
            model=model,
            num_microbatches=num_microbatches[step_id],
            forward_only=True,
        )
        if _rlprobe_slime_dump.record:  # rlprobe-patch
            _rlprobe_slime_dump.finish_step()
    return forward_data_store


def train_one_step(
    args,
    rollout_id,
    step_id,
    data_iterator,
    model,
    optimizer,
    opt_param_scheduler,
    num_microbatches,
    step_global_batch_size,
    microbatch_pbar=None,
):
    """One optimizer step.

    Args:
        step_global_batch_size: the rollouts of this step.
    """
    _rlprobe_slime_dump.begin_pass(model, False, "", rollout_id, step_id)  # rlprobe-patch
    args = get_args()

    def forward_step(data_iterator, model, return_schedule_plan=False):
        """One micro-batch."""
        if _rlprobe_slime_dump.record:  # rlprobe-patch
            _rlprobe_slime_dump.start_micro_batch(model, data_iterator)
        batch = get_batch(data_iterator, ["tokens"], args.data_pad_size_multiplier, args.allgather_cp)
        if return_schedule_plan:
            output_tensor = model.build_schedule_plan(input_ids=batch["tokens"])
        else:
            output_tensor = model(input_ids=batch["tokens"])
        if _rlprobe_slime_dump.record:  # rlprobe-patch
            _rlprobe_slime_dump.after_forward(output_tensor)
        return output_tensor, partial(loss_function, args, batch, num_microbatches, step_global_batch_size)

    forward_backward_func = get_forward_backward_func()
    losses_reduced = forward_backward_func(
        forward_step_func=_wrap(forward_step, microbatch_pbar),
        data_iterator=data_iterator,
        model=model,
        num_microbatches=num_microbatches,
        forward_only=False,
    )
    if _rlprobe_slime_dump.record:  # rlprobe-patch
        _rlprobe_slime_dump.finish_step()
    return losses_reduced


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
    def _rlprobe_on_rank(self, environ=None):
        # " on rank N", N the rank the launcher set (RANK, else LOCAL_RANK); "" without one.
        import os

        env = os.environ if environ is None else environ
        rank = env.get("RANK") or env.get("LOCAL_RANK")
        return f" on rank {rank}" if rank else ""
    def _rlprobe_switch(self, name, environ=None):
        # True or False for the switch `name`; ValueError naming it for any other value.
        import os

        env = os.environ if environ is None else environ
        raw = env.get(name, "")
        word = raw.strip().lower()
        if word in ("1", "true", "yes", "on"):
            return True
        if word in ("", "0", "false", "no", "off"):
            return False
        raise ValueError(
            f"rlprobe-patch: {name}={raw!r}{self._rlprobe_on_rank(env)} is not a switch value: "
            "on is one of 1, true, yes, on; off is one of 0, false, no, off, empty or unset (any case)"
        )
    def _rlprobe_switches(self, environ=None):
        # slime's switches: {"dump_on", "prompts_only", "phase", "phases", "warnings"}; DUMP_PHASE
        # is a comma-separated list of passes. ValueError naming the variable for a value that is
        # not allowed.
        import os

        env = os.environ if environ is None else environ
        dump_on = self._rlprobe_switch("DUMP_ON", env)
        prompts_only = self._rlprobe_switch("PROMPTS_ONLY", env)
        raw_phase = env.get("DUMP_PHASE", "")
        allowed = (
            "log_prob",
            "update_actor",
            "all",
            "ref_forward",
            "teacher_forward",
            "critic_forward",
            "update_critic",
        )
        phases = tuple(item.strip().lower() for item in raw_phase.split(",") if item.strip()) or ("log_prob",)
        unknown = [item for item in phases if item not in allowed]
        if unknown:
            raise ValueError(
                f"rlprobe-patch: DUMP_PHASE={raw_phase!r}{self._rlprobe_on_rank(env)}: "
                f"{', '.join(unknown)} is not a pass of slime: use a comma-separated list of "
                f"{', '.join(allowed)} (log_prob when unset)"
            )
        warnings = []
        if prompts_only:
            warnings.append(
                "rlprobe-patch: PROMPTS_ONLY is on: slime's hooks do not cut batches to their prompts; "
                "every pass runs on the whole batch"
            )
        return {
            "dump_on": dump_on,
            "prompts_only": prompts_only,
            "phase": ",".join(phases),
            "phases": phases,
            "warnings": warnings,
        }
    def _rlprobe_config_path(self, variable, default, environ=None):
        # The msprobe config a hook loads: `variable`'s value, else `default`; ValueError when it
        # is not a readable JSON object (msprobe's own checks come after, in _rlprobe_debugger).
        import os

        env = os.environ if environ is None else environ
        path = env.get(variable, "").strip()
        named = f"{variable}={path}" if path else f"{default} ({variable} is not set; this is the hook's default)"
        path = path or default
        where = f"rlprobe-patch: msprobe config {named}{self._rlprobe_on_rank(env)}"
        if not path or not os.path.isfile(path):
            raise ValueError(f"{where}: no such file; set {variable} to the config.json of this side")
        if not os.access(path, os.R_OK):
            raise ValueError(f"{where}: not readable by this process (uid {os.getuid()})")
        import json

        try:
            with open(path, encoding="utf-8") as config:
                data = json.load(config)
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"{where}: cannot be read: {exc}") from None
        except ValueError as exc:
            raise ValueError(f"{where}: not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{where}: not a JSON object")
        return path
    def _rlprobe_run_switches(self):
        # The switches of this process, read at the first hook call and kept for every hook of
        # the process: a wrong value stops the run there; warnings are printed once.
        import sys

        run = sys.modules.get("_rlprobe_patch_run")
        if run is None:
            import types

            switches = self._rlprobe_switches()
            for warning in switches["warnings"]:
                print(warning, file=sys.stderr, flush=True)
            run = types.ModuleType("_rlprobe_patch_run", "rlprobe-patch: the switches this process runs with")
            run.switches = switches
            run.announced = set()
            sys.modules["_rlprobe_patch_run"] = run
        return run.switches
    def _rlprobe_debugger(self, variable, config_path):
        # msprobe's debugger for `config_path`; its loader's refusal names the variable and the file.
        from msprobe.pytorch import PrecisionDebugger, seed_all

        seed_all(mode=True)
        try:
            return PrecisionDebugger(config_path=config_path)
        except Exception as exc:
            # msprobe marks its one instance initialized before checking: never leave a half-made one.
            PrecisionDebugger._instance = None
            raise ValueError(
                f"rlprobe-patch: msprobe config {variable}={config_path}{self._rlprobe_on_rank()}: "
                f"msprobe refuses it: {exc}"
            ) from exc
    def _rlprobe_announce(self, patch, rank, config_path, dump_path):
        # One line per patch and process when dumping is on, from rank 0 only, at the first hook call.
        import sys

        switches = self._rlprobe_run_switches()
        run = sys.modules["_rlprobe_patch_run"]
        if patch in run.announced or rank not in (0, "0", None):
            return
        run.announced.add(patch)
        print(
            f"rlprobe-patch: {patch} hooks active (rank {rank}): DUMP_PHASE={switches['phase']}, "
            f"config {config_path}, dump path {dump_path}, "
            f"PROMPTS_ONLY {'on' if switches['prompts_only'] else 'off'}",
            file=sys.stderr,
            flush=True,
        )


_rlprobe_slime_dump = _RlprobeSlimeDump()
