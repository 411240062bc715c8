# Case: the V1 trainer compares a DataProto fetched from TransferQueue; bypass returns early.
class PPOTrainer:
    def _compute_old_log_prob(self, batch, metrics):
        """Compute the old log prob of the batch."""
        _RlprobeLogprobCapture()._rlprobe_capture_precondition(self)  # rlprobe-patch: MISMATCH_ON
        bypass_recomputing_logprobs = rollout_corr_config and rollout_corr_config.get("bypass_mode", False)
        if bypass_recomputing_logprobs:
            return batch

        output = self.actor_rollout_wg.compute_log_prob(batch)
        data = DataProto(batch=fetch(batch).to_padded_tensor())

        if self.config.actor_rollout_ref.rollout.calculate_log_probs:
            metrics.update(calculate_debug_metrics(data))
        _RlprobeLogprobCapture()._rlprobe_capture_kv_logprobs(self, batch, data)  # rlprobe-patch: MISMATCH_ON

        return batch


class _RlprobeLogprobCapture:
    # Added by rlprobe-patch (verl.logprob-capture); `rlprobe-patch revert` removes it.
    # A class of its own, appended to the trainer's module: the trainer classes keep only the
    # hook lines (other patches add their methods there). Called with the trainer.
    def _rlprobe_capture_logprobs(self, trainer, batch):
        # One file per step from a DataProto holding rollout_log_probs and old_log_probs.
        capture = self._rlprobe_run_capture()
        if not capture["on"]:
            return
        import numpy as np

        tensors = batch.batch
        if "rollout_log_probs" not in tensors.keys():
            raise RuntimeError(
                f"rlprobe-patch: MISMATCH_ON, but the batch of step {trainer.global_steps} holds no rollout_log_probs: "
                "set actor_rollout_ref.rollout.calculate_log_probs=True (and no bypass mode)"
            )

        def host(key):
            value = tensors[key].detach()
            return (value.float() if value.is_floating_point() else value).cpu().numpy()

        responses = host("responses")
        prompt_width = tensors["attention_mask"].shape[-1] - responses.shape[-1]
        rows = responses.shape[0]
        request_ids, dataset_index, raw_prompts = self._rlprobe_non_tensor_columns(batch.non_tensor_batch, rows)
        prompt_mask = host("attention_mask")[:, :prompt_width]
        arrays = {
            "request_ids": request_ids,
            "prompt_lengths": prompt_mask.sum(axis=-1),
            "prompt_ids": self._rlprobe_prompt_ids(tensors, host, prompt_mask),
            "responses": responses,
            "response_mask": host("response_mask"),
            "rollout_log_probs": host("rollout_log_probs"),
            "old_log_probs": host("old_log_probs"),
            "ref_log_prob": host("ref_log_prob") if "ref_log_prob" in tensors.keys() else None,
            "dataset_index": dataset_index,
            "raw_prompts": raw_prompts,
            "source": f"verl {type(trainer).__name__}",
            "sampling": self._rlprobe_sampling(trainer),
            "provenance": self._rlprobe_provenance(trainer),
        }
        self._rlprobe_write_logprobs(capture["dir"], trainer.global_steps, arrays, np.ones(rows, dtype=bool))

    def _rlprobe_capture_kv_logprobs(self, trainer, batch, data):
        # `data`: the padded DataProto _compute_old_log_prob built from TransferQueue (responses,
        # response_mask, rollout_log_probs, old_log_probs); prompt lengths from the rows' tags;
        # request ids, dataset indices and raw prompts read from the same rows (on only).
        capture = self._rlprobe_run_capture()
        if not capture["on"]:
            return
        import numpy as np

        tensors = data.batch
        if "rollout_log_probs" not in tensors.keys():
            raise RuntimeError(
                f"rlprobe-patch: MISMATCH_ON, but the batch of step {trainer.global_steps} holds no rollout_log_probs: "
                "set actor_rollout_ref.rollout.calculate_log_probs=True (and no bypass mode)"
            )

        def host(value):
            value = value.detach()
            return (value.float() if value.is_floating_point() else value).cpu().numpy()

        rows = len(batch)
        tags = [dict(tag) for tag in batch.tags]
        # verl's own padding rows (upsample_batch_to_divisible_size) are tagged; they are no request.
        keep = np.array([not tag.get("is_padding", False) for tag in tags], dtype=bool)
        prompt_lengths = np.array([int(tag.get("prompt_len", -1)) for tag in tags], dtype=np.int64)
        non_tensor = self._rlprobe_kv_columns(batch, ("extra_fields", "index", "raw_prompt", "input_ids"), rows)
        prompt_ids = self._rlprobe_kv_prompt_ids(non_tensor.pop("input_ids", None), prompt_lengths, host)
        extra = non_tensor.pop("extra_fields", None)
        if extra is not None:
            non_tensor["request_id"] = [e.get("request_id") if isinstance(e, dict) else None for e in extra]
        request_ids, dataset_index, raw_prompts = self._rlprobe_non_tensor_columns(non_tensor, rows)
        arrays = {
            "request_ids": request_ids,
            "prompt_lengths": prompt_lengths,
            "prompt_ids": prompt_ids,
            "responses": host(tensors["responses"]),
            "response_mask": host(tensors["response_mask"]),
            "rollout_log_probs": host(tensors["rollout_log_probs"]),
            "old_log_probs": host(tensors["old_log_probs"]),
            "ref_log_prob": None,  # computed after _compute_old_log_prob in the V1 trainer
            "dataset_index": dataset_index,
            "raw_prompts": raw_prompts,
            "source": f"verl {type(trainer).__name__}",
            "sampling": self._rlprobe_sampling(trainer),
            "provenance": self._rlprobe_provenance(trainer),
        }
        self._rlprobe_write_logprobs(capture["dir"], trainer.global_steps, arrays, keep)

    def _rlprobe_sampling(self, trainer):
        # The rollout's sampling settings as the run's config holds them, defaults included (temperature,
        # top_p, top_k, logprobs_mode of actor_rollout_ref.rollout): JSON text for the report's diagnosis; None
        # where the config cannot be read.
        import json

        try:
            rollout = trainer.config.actor_rollout_ref.rollout
            settings = {}
            for key in ("temperature", "top_p", "top_k", "logprobs_mode"):
                value = rollout.get(key, None)
                if value is not None:
                    settings[key] = value if isinstance(value, (bool, int, float, str)) else str(value)
            return json.dumps(settings)
        except Exception:
            return None

    def _rlprobe_kv_columns(self, batch, fields, rows):
        # {field: one value per row} of the batch's TransferQueue rows, one read per field. A field
        # the rows lack (TransferQueue raises) or a failed read is left out, said once per process:
        # the capture must never fail a training step for a column it could not read.
        import transfer_queue as tq

        columns = {}
        for field in fields:
            try:
                got = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=[field])
                # A NonTensorStack, a list or an array (a jagged tensor: one per row), depending on the storage.
                values = [v.data if type(v).__name__ == "NonTensorData" else v for v in list(got[field])]
                if len(values) != rows:
                    raise ValueError(f"{len(values)} values for {rows} rows")
            except Exception as exc:
                self._rlprobe_unread(field, "TransferQueue", exc)
                continue
            columns[field] = values
        return columns

    def _rlprobe_unread(self, column, where, exc):
        # A column the capture could not read: said once per process on stderr, and the step goes on
        # without it (the capture must never fail a training step for a column it could not read).
        import sys

        unread = self._rlprobe_run_capture().setdefault("unread", set())
        if column not in unread:
            unread.add(column)
            print(
                f"rlprobe-patch: MISMATCH_ON: the capture reads no {column!r} from {where} "
                f"({type(exc).__name__}: {exc}); that column stays empty",
                file=sys.stderr,
                flush=True,
            )

    def _rlprobe_prompt_ids(self, tensors, host, prompt_mask):
        # The prompt ids the training forward scored: the prompt columns of `input_ids` (else `prompts`),
        # each row's valid tokens (attention mask 1: verl pads prompts on the left) moved to the left, 0
        # after them, as wide as the longest prompt. None where the batch holds neither.
        import numpy as np

        try:
            key = "input_ids" if "input_ids" in tensors.keys() else "prompts"
            if key not in tensors.keys():
                return None
            ids = host(key)[:, : prompt_mask.shape[-1]]
            valid = prompt_mask.astype(bool)
            # a stable sort of "not valid" keeps the valid tokens in their order, first
            ids = np.take_along_axis(ids, np.argsort(~valid, axis=1, kind="stable"), axis=1)
            lengths = valid.sum(axis=1)
            ids[np.arange(ids.shape[1])[None, :] >= lengths[:, None]] = 0
            return ids[:, : int(lengths.max(initial=0))]
        except Exception as exc:
            self._rlprobe_unread("prompt_ids", "the batch", exc)
            return None

    def _rlprobe_kv_prompt_ids(self, input_ids, prompt_lengths, host):
        # The V1 trainer's prompt ids: each row's `input_ids` as stored in TransferQueue (prompt then
        # response, no padding; what the actor scores), its first `prompt_len` (the row's tag), left-aligned.
        import numpy as np

        if input_ids is None:
            return None
        try:
            out = np.zeros((len(input_ids), int(prompt_lengths.max(initial=0))), dtype=np.int64)
            for i, (row, length) in enumerate(zip(input_ids, prompt_lengths)):
                row = np.asarray(host(row)).reshape(-1)
                if not 0 <= length <= row.shape[0]:
                    raise ValueError(f"row {i}: prompt_len {length}, {row.shape[0]} input ids")
                out[i, :length] = row[:length]
            return out
        except Exception as exc:
            self._rlprobe_unread("prompt_ids", "the rows' input_ids and prompt_len tags", exc)
            return None

    def _rlprobe_provenance(self, trainer):
        # What computed each side, as the run's composed config sets it (verl's defaults included): JSON
        # text of scalars; a key that cannot be read is left out (said once), None where none can be.
        import json
        import sys

        provenance = {}
        verl = sys.modules.get("verl")
        if getattr(verl, "__version__", None):
            provenance["verl_version"] = str(verl.__version__)
        found = {}
        try:
            found["training_strategy"], found["training_dtype"] = self._rlprobe_training_dtype(trainer.config)
        except Exception as exc:
            self._rlprobe_unread("training_dtype", "the config", exc)
        try:
            rollout = trainer.config.actor_rollout_ref.rollout
            found["rollout_name"], dtype = rollout.get("name", None), rollout.get("dtype", None)
            found["rollout_dtype"] = None if dtype is None else self._rlprobe_dtype(dtype)
        except Exception as exc:
            self._rlprobe_unread("rollout_dtype", "the config", exc)
        provenance.update({key: str(value) for key, value in found.items() if value is not None})
        return json.dumps(provenance) if provenance else None

    def _rlprobe_training_dtype(self, config):
        # (the actor's strategy, the dtype its log-prob forward computes in), as verl decides it from the
        # config: FSDP (fsdp, fsdp2): the engine workers (verl 0.8.0+: trainer.use_legacy_worker_impl
        # is gone) autocast to fsdp_config.mixed_precision.param_dtype (bf16 where unset); before 0.8.0 the
        # engine workers (use_legacy_worker_impl=disable, 0.7.x) autocast to bfloat16 whatever it says, and
        # the legacy workers (0.6.x always) to fsdp_config.dtype (bfloat16 where absent, as in 0.6.0),
        # the param dtype where that is float32 (autocast does nothing then). Megatron: megatron.dtype
        # (bfloat16 where absent, as in 0.6.0). Another strategy: no dtype.
        import importlib.util

        actor = config.actor_rollout_ref.actor
        strategy = actor.get("strategy", None)
        if strategy == "megatron":
            return strategy, self._rlprobe_dtype(actor.megatron.get("dtype", None) or "bfloat16")
        if strategy not in ("fsdp", "fsdp2"):
            return strategy, None
        fsdp = actor.fsdp_config
        mixed = fsdp.get("mixed_precision", None)
        param = mixed.get("param_dtype", "bf16") if mixed is not None else None
        legacy = config.trainer.get("use_legacy_worker_impl", None)
        if legacy is None:
            return strategy, self._rlprobe_dtype(param or "bf16")
        if legacy == "disable" and importlib.util.find_spec("verl.workers.engine_workers") is not None:
            return strategy, "bfloat16"
        autocast = self._rlprobe_dtype(fsdp.get("dtype", None) or "bfloat16")
        return strategy, self._rlprobe_dtype(param or fsdp.get("dtype")) if autocast == "float32" else autocast

    def _rlprobe_dtype(self, value):
        # verl's and the engines' names of a dtype (PrecisionType's, vLLM's "half" / "float") as torch
        # names it; any other value (vLLM's "auto") as written.
        names = {"bfloat16": ("bf16", "bfloat16"), "float16": ("fp16", "float16", "16", "half")}
        names["float32"] = ("fp32", "float32", "32", "float")
        text = str(value).strip().lower().removeprefix("torch.")
        return next((name for name, aliases in names.items() if text in aliases), str(value))

    def _rlprobe_capture_precondition(self, trainer):
        # With MISMATCH_ON, refuse a run whose batches will hold no two log-probs to compare, at
        # its first step: bypass mode (old_log_probs are the rollout's) or calculate_log_probs off.
        if not self._rlprobe_run_capture()["on"]:
            return
        correction = trainer.config.algorithm.get("rollout_correction", None)
        if correction is not None and correction.get("bypass_mode", False):
            raise RuntimeError(
                "rlprobe-patch: MISMATCH_ON, but algorithm.rollout_correction.bypass_mode=True: old_log_probs are "
                "the rollout's own log-probs, there is nothing to compare; capture with bypass mode off"
            )
        if not trainer.config.actor_rollout_ref.rollout.get("calculate_log_probs", False):
            raise RuntimeError(
                "rlprobe-patch: MISMATCH_ON, but actor_rollout_ref.rollout.calculate_log_probs is off: the batches "
                "hold no rollout_log_probs; set actor_rollout_ref.rollout.calculate_log_probs=True"
            )

    def _rlprobe_write_logprobs(self, directory, step, arrays, keep):
        # One step's capture, `step-<step:06d>.rlprobe-logprobs.npz` in `directory`: the rows of
        # `keep` only (padding rows never appear as requests), written whole or not at all.
        import os
        import tempfile

        import numpy as np

        mask = np.asarray(arrays["response_mask"]).astype(bool)[keep]
        out = {
            "format": np.array("rlprobe-logprobs"),
            "format_version": np.array(1, dtype=np.int64),
            "step": np.array(int(step), dtype=np.int64),
            "request_ids": np.array([str(r) for r in arrays["request_ids"]], dtype=str)[keep],
            "prompt_lengths": np.asarray(arrays["prompt_lengths"], dtype=np.int64)[keep],
            "response_lengths": mask.sum(axis=1).astype(np.int64),
            "responses": np.asarray(arrays["responses"], dtype=np.int64)[keep],
            "response_mask": mask,
            "rollout_log_probs": np.asarray(arrays["rollout_log_probs"], dtype=np.float32)[keep],
            "old_log_probs": np.asarray(arrays["old_log_probs"], dtype=np.float32)[keep],
            "source": np.array(arrays["source"]),
        }
        for key, dtype in (("ref_log_prob", np.float32), ("dataset_index", np.int64)):
            if arrays.get(key) is not None:
                out[key] = np.asarray(arrays[key], dtype=dtype)[keep]
        if arrays.get("sampling") is not None:
            out["sampling"] = np.array(arrays["sampling"])
        if arrays.get("prompt_ids") is not None:
            out["prompt_ids"] = np.asarray(arrays["prompt_ids"], dtype=np.int64)[keep]
        if arrays.get("provenance") is not None:
            out["provenance"] = np.array(arrays["provenance"])
        if arrays.get("raw_prompts") is not None:
            out["raw_prompts"] = np.array([str(p) for p in arrays["raw_prompts"]], dtype=str)[keep]
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"step-{int(step):06d}.rlprobe-logprobs.npz")
        fd, tmp = tempfile.mkstemp(prefix=".step-", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **out)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return path

    def _rlprobe_non_tensor_columns(self, non_tensor, rows):
        # Request ids (verl.request-id's, "" where none), dataset indices (-1 where none) and raw
        # prompts (a chat as JSON text) from the batch's non-tensor columns, where verl has them.
        import json

        import numpy as np

        def column(key):
            values = non_tensor.get(key) if non_tensor is not None else None
            return None if values is None else list(values)

        ids = column("request_id")
        request_ids = ["" if ids is None or ids[i] is None else str(ids[i]) for i in range(rows)]
        index = column("index")
        dataset_index = None
        if index is not None:
            dataset_index = np.array(
                [int(v) if isinstance(v, (int, np.integer)) or str(v).lstrip("-").isdigit() else -1 for v in index]
            )
        prompts = column("raw_prompt")
        raw_prompts = None
        if prompts is not None:
            raw_prompts = [
                p if isinstance(p, str) else json.dumps(p.tolist() if hasattr(p, "tolist") else p, default=str)
                for p in prompts
            ]
        return request_ids, dataset_index, raw_prompts

    # The switch reader (patches/_shared/switches.py): MISMATCH_ON / MISMATCH_DIR read once per process.
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
    def _rlprobe_capture_switches(self, environ=None):
        # The log-prob capture's switches: {"on", "dir", "warnings"}. `MISMATCH_ON` is a switch
        # (the values above); `MISMATCH_DIR` the folder of the per-step files (default
        # `rlprobe-logprobs` in the working directory). ValueError naming the variable otherwise.
        import os

        env = os.environ if environ is None else environ
        on = self._rlprobe_switch("MISMATCH_ON", env)
        raw_dir = env.get("MISMATCH_DIR", "")
        directory = raw_dir.strip() or "rlprobe-logprobs"
        if "\n" in directory or "\0" in directory:
            raise ValueError(
                f"rlprobe-patch: MISMATCH_DIR={raw_dir!r}{self._rlprobe_on_rank(env)} is not a folder name"
            )
        warnings = []
        if on and self._rlprobe_switch("PROMPTS_ONLY", env):
            warnings.append(
                "rlprobe-patch: MISMATCH_ON with PROMPTS_ONLY on: the batches are cut to their prompts and hold "
                "no response token to compare; capture on a run without PROMPTS_ONLY"
            )
        if raw_dir.strip() and not on:
            warnings.append("rlprobe-patch: MISMATCH_DIR is set and MISMATCH_ON is off: nothing is captured")
        return {"on": on, "dir": directory, "warnings": warnings}
    def _rlprobe_run_capture(self):
        # The capture switches of this process, read at the first step and kept (as the dump
        # switches are): off, each later step costs one dictionary lookup.
        import sys

        run = sys.modules.get("_rlprobe_patch_capture")
        if run is None:
            import types

            capture = self._rlprobe_capture_switches()
            for warning in capture["warnings"]:
                print(warning, file=sys.stderr, flush=True)
            run = types.ModuleType("_rlprobe_patch_capture", "rlprobe-patch: the capture switches of this process")
            run.capture = capture
            sys.modules["_rlprobe_patch_capture"] = run
        return run.capture
