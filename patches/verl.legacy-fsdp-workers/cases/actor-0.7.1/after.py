"""Single Process Actor (the shape of verl 0.7.1's dp_actor.py, shortened)."""

import logging
import os

import torch

from verl import DataProto
from verl.utils.device import get_device_id
from verl.utils.profiler import GPUMemoryLogger
from verl.workers.actor import BasePPOActor

logger = logging.getLogger(__file__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "WARN"))


class DataParallelPPOActor(BasePPOActor):
    """FSDP DataParallel PPO Actor or Ref worker"""

    def __init__(self, config, actor_module, actor_optimizer=None):
        """When optimizer is None, it is Reference Policy"""
        super().__init__(config)
        self.actor_module = actor_module
        self.actor_optimizer = actor_optimizer
        if self.config.get("calculate_sum_pi_squared", False):
            self.calculate_sum_pi_squared_from_logits = None
        self._debugger = None  # rlprobe-patch
        self._update_actor_logger_fp = None

    def compute_log_prob(self, data: DataProto, calculate_entropy: bool = False) -> dict[str, torch.Tensor]:
        """Compute the log probability of the responses.

        Returns:
            dict[str, torch.Tensor]: a dict containing keys
        """
        data = self._prompts_only_batch(data)  # rlprobe-patch
        dump_this_call = self._should_dump(forward_only=True)
        self.actor_module.eval()
        micro_batch_size = data.meta_info["micro_batch_size"]
        use_dynamic_bsz = data.meta_info["use_dynamic_bsz"]
        has_multi_modal_inputs = "multi_modal_inputs" in data.non_tensor_batch.keys()

        select_keys = ["responses", "input_ids", "attention_mask", "position_ids"]
        non_tensor_select_keys = ["multi_modal_inputs"] if has_multi_modal_inputs else []
        if self.use_prefix_grouper:
            if "uid" in data.non_tensor_batch:
                non_tensor_select_keys.append("uid")
        non_tensor_select_keys = self._dump_keys(data, non_tensor_select_keys, dump_this_call)  # rlprobe-patch

        data = data.select(batch_keys=select_keys, non_tensor_batch_keys=non_tensor_select_keys)

        if use_dynamic_bsz:
            micro_batches, batch_idx_list = prepare_dynamic_batch(data, max_token_len=1024)
        else:
            micro_batches = data.split(micro_batch_size)

        log_probs_lst = []
        for micro_batch in micro_batches:
            if dump_this_call:  # rlprobe-patch
                self._debugger.start(model=self.actor_module)
            micro_batch = micro_batch.to(get_device_id())
            model_inputs = {**micro_batch.batch, **micro_batch.non_tensor_batch, "pad_token_id": 0}
            with torch.no_grad():
                outputs = self._forward_micro_batch(model_inputs, temperature=1.0)
            log_probs_lst.append(outputs["log_probs"])
            if dump_this_call:  # rlprobe-patch
                self._finish_dump_step(micro_batch)

        outputs = {"log_probs": torch.concat(log_probs_lst, dim=0)}
        return outputs

    @GPUMemoryLogger(role="dp actor", logger=logger)
    def update_policy(self, data: DataProto):
        dump_this_call = self._should_dump(forward_only=False)  # rlprobe-patch
        # make sure we are in training mode
        self.actor_module.train()
        select_keys = ["responses", "response_mask", "input_ids", "attention_mask", "position_ids"]
        non_tensor_select_keys = []
        if self.use_prefix_grouper and "uid" in data.non_tensor_batch.keys():
            non_tensor_select_keys.append("uid")
        non_tensor_select_keys = self._dump_keys(data, non_tensor_select_keys, dump_this_call)  # rlprobe-patch

        data = data.select(batch_keys=select_keys, non_tensor_batch_keys=non_tensor_select_keys)
        mini_batches = data.split(self.config.ppo_mini_batch_size)

        metrics = {"actor/pg_loss": 0.0}
        for _ in range(self.config.ppo_epochs):
            for batch_idx, mini_batch in enumerate(mini_batches):
                micro_batches = mini_batch.split(self.config.ppo_micro_batch_size_per_gpu)
                self.actor_optimizer.zero_grad()

                for micro_batch in micro_batches:
                    if dump_this_call:  # rlprobe-patch
                        self._debugger.start(model=self.actor_module)
                    micro_batch = micro_batch.to(get_device_id())
                    model_inputs = {**micro_batch.batch, **micro_batch.non_tensor_batch, "pad_token_id": 0}
                    outputs = self._forward_micro_batch(model_inputs, temperature=1.0)
                    loss = -outputs["log_probs"].mean()
                    if self.scaler is not None:
                        self.scaler.scale(loss).backward()
                    else:
                        loss.backward()

                    metrics["actor/pg_loss"] += loss.detach().item()
                    if dump_this_call:  # rlprobe-patch
                        self._finish_dump_step(micro_batch)

                grad_norm = self._optimizer_step()
        self.actor_optimizer.zero_grad()
        return metrics

    # Added by rlprobe-patch (verl.legacy-fsdp-workers); `rlprobe-patch revert` removes it.
    def _ensure_debugger(self):
        # Lazy: nothing is imported or opened until DUMP_ON asks for it; the ref policy never dumps.
        # The switches are read once per process (patches/_shared/switches.py): a wrong value stops
        # the run here.
        if getattr(self, "_debugger", None) is not None:
            return
        if not self._rlprobe_run_switches()["dump_on"] or self.actor_optimizer is None:
            return
        config_path = self._rlprobe_config_path("MSPROBE_ACTOR_CONFIG", "/home/config_actor.json")
        self._debugger = self._rlprobe_debugger("MSPROBE_ACTOR_CONFIG", config_path)
        # DataParallelPPOActor has no self.rank.
        self._rlprobe_announce("verl.legacy-fsdp-workers r2", torch.distributed.get_rank() if torch.distributed.is_initialized() else 0, config_path, self._debugger.config.dump_path)
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
        dump_phase = self._rlprobe_run_switches()["phase"]
        phase = "log_prob" if forward_only else "update_actor"
        return dump_phase in ("all", phase)

    def _log_update_actor_step(self, micro_batch):
        if getattr(self, "_update_actor_logger_fp", None) is None:
            return
        import json
        import time

        # A DataProto micro-batch: the ids are in its non-tensor part (kept by `_dump_keys`).
        request_ids = getattr(micro_batch, "non_tensor_batch", {}).get("request_id", None)
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
        if not self._rlprobe_run_switches()["prompts_only"]:
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
