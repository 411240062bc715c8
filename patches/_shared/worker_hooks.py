"""Helper methods the four worker hooks insert, written once.

`verl.fsdp-engine`, `verl.megatron-engine`, `verl.legacy-fsdp-workers` and
`verl.legacy-megatron-workers` add these methods to verl's classes. A payload takes one with a
line in its class, `_should_dump = DumpPhase._should_dump`, and the catalogue loader splices
the method in place of that line, verbatim (`src/rlprobe_patch/codemod/_payload_parts.py`). The classes here only
group the methods: each is the variant a set of patches shares.

A name in capitals (`RANK`) is a slot: each payload fills it with its own module-level function
of that name, whose body is comments and one `return EXPR`. The name becomes EXPR and the
comments go on their own lines above it. So the update_actor_log.jsonl line is written once,
in `UpdateActorLog`, and each patch says only where its rank and request ids come from.

The inserted text must stay byte-identical for releases already patched: changing a method
here changes every patch that takes it; bump their `revision` (CONTRIBUTING.md).
"""

import logging
import os

import torch

# verl's files define `logger` at module level; here so that this file can be read on its own.
logger = logging.getLogger(__file__)


class EngineDebugger:
    """The debugger of an engine (`verl.fsdp-engine`, `verl.megatron-engine`): the ref engine never dumps.

    Takes the methods of `switches.Switches`. Slots: `PATCH` (the patch id and revision in the line
    it prints when dumping is on) and `RANK`.
    """

    def _ensure_debugger(self):
        # Lazy: nothing is imported or opened until DUMP_ON asks for it. The switches are read
        # once per process (patches/_shared/switches.py): a wrong value stops the run here.
        if getattr(self, "_debugger", None) is not None:
            return
        if not self._rlprobe_run_switches()["dump_on"] or self.engine_config.forward_only:
            return
        config_path = self._rlprobe_config_path("MSPROBE_ACTOR_CONFIG", "/home/config_actor.json")
        self._debugger = self._rlprobe_debugger("MSPROBE_ACTOR_CONFIG", config_path)
        self._rlprobe_announce(PATCH, RANK, config_path, self._debugger.config.dump_path)
        try:
            log_dir = os.path.join(self._debugger.config.dump_path, str(os.getpid()))
            os.makedirs(log_dir, exist_ok=True)
            self._update_actor_logger_fp = open(os.path.join(log_dir, "update_actor_log.jsonl"), "a", encoding="utf-8")
        except Exception as exc:
            logger.warning(f"Failed to initialize update_actor_logger: {exc}")


class ActorDebugger:
    """The debugger of a legacy PPO actor (`verl.legacy-*-workers`): the ref policy (no optimizer) never dumps.

    Takes the methods of `switches.Switches`. Slots: `PATCH` and `RANK`, as `EngineDebugger`.
    """

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
        self._rlprobe_announce(PATCH, RANK, config_path, self._debugger.config.dump_path)
        try:
            log_dir = os.path.join(self._debugger.config.dump_path, str(os.getpid()))
            os.makedirs(log_dir, exist_ok=True)
            self._update_actor_logger_fp = open(os.path.join(log_dir, "update_actor_log.jsonl"), "a", encoding="utf-8")
        except Exception as exc:
            logger.warning(f"Failed to initialize update_actor_logger: {exc}")


class DumpPhase:
    """`DUMP_PHASE` against the phase of the call (`verl.legacy-fsdp-workers` words its comment its own way)."""

    def _should_dump(self, forward_only):
        # Decided once per forward_backward_batch call: forward-only calls are log-prob passes.
        self._ensure_debugger()
        if getattr(self, "_debugger", None) is None:
            return False
        dump_phase = self._rlprobe_run_switches()["phase"]
        phase = "log_prob" if forward_only else "update_actor"
        return dump_phase in ("all", phase)


class UpdateActorLog:
    """One update_actor_log.jsonl line per dumped step: the log format, for every worker hook.

    Slots: `REQUEST_IDS` (the micro-batch's top-level request ids, or None) and `RANK`. Without
    them, the ids come from each sample's `extra_fields` (verl's V1 trainer), padding samples left out.
    """

    def _log_update_actor_step(self, micro_batch):
        if getattr(self, "_update_actor_logger_fp", None) is None:
            return
        import json
        import time

        request_ids = REQUEST_IDS
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
            "rank": RANK,
            "step": self._debugger.service.current_iter,
            "request_ids": request_ids,
            "num_requests": len(request_ids),
        }
        self._update_actor_logger_fp.write(json.dumps(record) + "\n")
        self._update_actor_logger_fp.flush()


class LoopSteps:
    """Steps of a micro-batch loop (`verl.fsdp-engine`, `verl.legacy-fsdp-workers`): closed at the end of the body."""

    def _finish_dump_step(self, micro_batch):
        # Once msprobe has dumped every step its config asks for, it only has to be stopped.
        if not self._debugger.service.should_stop_service:
            self._log_update_actor_step(micro_batch)
        self._debugger.stop()
        self._debugger.step()


class PipelineSteps:
    """Steps of Megatron's pipeline schedule (`verl.megatron-engine`, `verl.legacy-megatron-workers`),
    on every pipeline stage: one step per micro-batch per model chunk, opened when `forward_step`
    takes its micro-batch, closed when the loss is ready (log-prob passes; on a stage before the
    last, when the chunk's forward returns) or after that chunk's backward of it (training). A
    stage before the last runs later forwards before an earlier backward (1F1B, interleaved):
    there the backward is a step of its own. Its own `_should_dump` and `_log_update_actor_step`
    (the line names the micro-batch, chunk, stage and passes of its step). Slots: `REQUEST_IDS`, `RANK`.
    """

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

        rank = RANK
        ranks = getattr(self._debugger.config, "rank", None)
        if ranks and rank not in ranks:
            return  # msprobe dumps nothing on a rank its config leaves out
        micro_batch = unit["batch"]
        request_ids = REQUEST_IDS
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



class PromptsOnly:
    """`PROMPTS_ONLY=1` trimming of the log-prob pass in the legacy actors (`verl.legacy-*-workers`)."""

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
