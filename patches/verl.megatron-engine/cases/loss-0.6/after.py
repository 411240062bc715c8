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
        # Lazy: nothing is imported or opened until DUMP_ON asks for it. The switches are read
        # once per process (patches/_shared/switches.py): a wrong value stops the run here.
        if getattr(self, "_debugger", None) is not None:
            return
        if not self._rlprobe_run_switches()["dump_on"] or self.engine_config.forward_only:
            return
        config_path = self._rlprobe_config_path("MSPROBE_ACTOR_CONFIG", "/home/config_actor.json")
        self._debugger = self._rlprobe_debugger("MSPROBE_ACTOR_CONFIG", config_path)
        # MegatronEngine has no self.rank.
        self._rlprobe_announce("verl.megatron-engine r2", torch.distributed.get_rank() if torch.distributed.is_initialized() else 0, config_path, self._debugger.config.dump_path)
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
        dump_phase = self._rlprobe_run_switches()["phase"]
        phase = "log_prob" if forward_only else "update_actor"
        self._dump_phase = phase
        self._dump_counts = {}  # micro-batches taken so far in this call, per model chunk
        return dump_phase in ("all", phase)

    def _log_update_actor_step(self, unit):
        if getattr(self, "_update_actor_logger_fp", None) is None:
            return
        import json
        import time

        # MegatronEngine has no self.rank.
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        ranks = getattr(self._debugger.config, "rank", None)
        if ranks and rank not in ranks:
            return  # msprobe dumps nothing on a rank its config leaves out
        micro_batch = unit["batch"]
        request_ids = micro_batch.get("request_id", None) if "request_id" in micro_batch.keys() else None
        if request_ids is None and hasattr(micro_batch, "keys") and "extra_fields" in micro_batch.keys():
            # verl's V1 trainer keeps each sample's fields (request_id among them) in a dict per
            # sample, `extra_fields`, and never copies them to the top level. Padding samples
            # (uid "pad...", added by `_balance_batch`) copy the first sample's fields: left out.
            extra_fields = micro_batch["extra_fields"]
            extra_fields = extra_fields.tolist() if hasattr(extra_fields, "tolist") else list(extra_fields)
            uids = micro_batch["uid"] if "uid" in micro_batch.keys() else [None] * len(extra_fields)
            uids = uids.tolist() if hasattr(uids, "tolist") else list(uids)
            request_ids = [
                fields["request_id"]
                for fields, uid in zip(extra_fields, uids)
                if isinstance(fields, dict) and fields.get("request_id") is not None and not str(uid).startswith("pad")
            ]
        if request_ids is None:
            request_ids = []
        elif hasattr(request_ids, "tolist"):
            request_ids = request_ids.tolist()
        request_ids = [str(request_id) for request_id in request_ids]
        try:
            from megatron.core import parallel_state

            pp_rank = parallel_state.get_pipeline_model_parallel_rank()
        except Exception:
            pp_rank = None
        record = {
            "source": "update_actor",
            "timestamp": time.time(),
            "pid": os.getpid(),
            "rank": rank,
            "step": self._debugger.service.current_iter,
            "request_ids": request_ids,
            "num_requests": len(request_ids),
            "phase": getattr(self, "_dump_phase", None),
            "micro_batch": unit["micro_batch"],
            "pp_rank": pp_rank,
            "vp_stage": unit["vp_stage"],
            "passes": list(unit["passes"]),
        }
        self._update_actor_logger_fp.write(json.dumps(record) + "\n")
        self._update_actor_logger_fp.flush()

    def _start_dump_step(self, model, batch):
        # One step per micro-batch per model chunk. A step still open is closed first: on a
        # pipeline stage before the last, 1F1B runs later micro-batches' forwards before an
        # earlier one's backward, and that backward then gets a step of its own.
        self._finish_dump_step()
        while isinstance(getattr(model, "module", None), torch.nn.Module):
            model = model.module  # unwrap DDP / Float16Module, as verl's unwrap_model does
        counts = getattr(self, "_dump_counts", {})
        index = counts.get(id(model), 0)
        counts[id(model)] = index + 1
        unit = {"batch": batch, "model": model, "micro_batch": index, "vp_stage": getattr(model, "vp_stage", None)}
        self._open_dump_step(unit, "forward")
        training = torch.is_grad_enabled() and getattr(self, "_dump_phase", None) == "update_actor"
        if training or getattr(model, "post_process", True) is False:

            def _after_forward(module, args, output):
                handle.remove()
                if not training:
                    # A stage before the last sees no loss: its forward is the whole step.
                    self._finish_dump_step(unit)
                    return
                outputs = list(output.values()) if isinstance(output, dict) else output
                for tensor in outputs if isinstance(outputs, (list, tuple)) else [outputs]:
                    if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
                        # This chunk's backward of this micro-batch begins when the gradient
                        # reaches its output (the received activation gradient before the last stage).
                        tensor.register_hook(lambda grad: self._dump_backward_begins(unit))
                        break

            handle = model.register_forward_hook(_after_forward)

    def _open_dump_step(self, unit, what):
        unit["passes"] = [what]
        self._dump_micro_batch = unit
        self._debugger.start(model=unit["model"])

    def _dump_after_loss(self, loss, forward_only):
        unit = getattr(self, "_dump_micro_batch", None)
        if unit is None:
            return
        if forward_only or not (isinstance(loss, torch.Tensor) and loss.requires_grad):
            self._finish_dump_step()
            return
        loss.register_hook(lambda grad: self._dump_backward_begins(unit))

    def _dump_backward_begins(self, unit):
        # Runs when the backward of `unit` starts on this chunk (from the loss on the last stage,
        # else from the chunk's output); the queued callback runs once that backward has finished.
        if unit.get("backward"):
            return
        unit["backward"] = True
        if getattr(self, "_dump_micro_batch", None) is unit:
            unit["passes"].append("backward")
        else:
            self._finish_dump_step()
            self._open_dump_step(unit, "backward")
        torch.autograd.Variable._execution_engine.queue_callback(lambda: self._finish_dump_step(unit))

    def _finish_dump_step(self, unit=None):
        current = getattr(self, "_dump_micro_batch", None)
        if current is None or (unit is not None and unit is not current):
            return
        self._dump_micro_batch = None
        # Once msprobe has dumped every step its config asks for, it only has to be stopped.
        if not self._debugger.service.should_stop_service:
            self._log_update_actor_step(current)
        self._debugger.stop()
        self._debugger.step()

    # The switch reader (patches/_shared/switches.py).
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
        # The run's switches: {"dump_on", "prompts_only", "phase", "warnings"}; ValueError naming
        # the variable for a value that is not allowed.
        import os

        env = os.environ if environ is None else environ
        dump_on = self._rlprobe_switch("DUMP_ON", env)
        prompts_only = self._rlprobe_switch("PROMPTS_ONLY", env)
        raw_phase = env.get("DUMP_PHASE", "")
        phase = raw_phase.strip().lower() or "log_prob"
        if phase not in ("log_prob", "update_actor", "all"):
            raise ValueError(
                f"rlprobe-patch: DUMP_PHASE={raw_phase!r}{self._rlprobe_on_rank(env)} is not a phase: "
                "use one of log_prob, update_actor, all (log_prob when unset)"
            )
        warnings = []
        if prompts_only and not dump_on:
            warnings.append(
                "rlprobe-patch: PROMPTS_ONLY is on and DUMP_ON is off: batches are cut to their prompts "
                "before the log-prob pass and nothing is dumped"
            )
        if prompts_only and phase != "log_prob":
            warnings.append(
                f"rlprobe-patch: DUMP_PHASE={phase} under PROMPTS_ONLY: only the log-prob pass sees the "
                "prompts the rollout prefilled; update_actor steps run on prompt-only batches and pair "
                "with nothing on the rollout side"
            )
        return {"dump_on": dump_on, "prompts_only": prompts_only, "phase": phase, "warnings": warnings}

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
