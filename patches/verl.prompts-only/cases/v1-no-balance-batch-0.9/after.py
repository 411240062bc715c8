# Case: a V1 `_step_once` without the `_balance_batch` call before the old-log-prob block (as with
# a release that balances elsewhere). Not refused: the anchor is the old-log-prob block, and the
# trim there covers every row the old-log-prob pass reads.
import os

import transfer_queue as tq

from verl.utils import tensordict_utils as tu


class PPOTrainer(ABC):
    def _step_once(self, metrics: dict, timing_raw: dict, sample_batch_size: int) -> KVBatchMeta:
        with marked_timer("gen", timing_raw, color="red"):
            batch, off_policy_metrics = self.replay_buffer.sample(global_steps=self.global_steps)
        compute_prompts_only = self._rlprobe_run_switches()["prompts_only"]  # rlprobe-patch: PROMPTS_ONLY
        if compute_prompts_only:
            batch = self._prompts_only_kv_batch(batch)

        with marked_timer("old_log_prob", timing_raw, color="blue"):
            batch = self._compute_old_log_prob(batch, metrics=metrics)
        return batch

    # Added by rlprobe-patch (verl.prompts-only); `rlprobe-patch revert` removes it.
    def _prompts_only_kv_batch(self, batch):
        # One row per sample in TransferQueue; `prompts` gives each row's prompt length.
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id)
        prompt_lens = [row.size(0) for row in data["prompts"].unbind(0)]
        trimmed = {}
        for key in data.keys():
            if key in ("input_ids", "attention_mask", "position_ids"):
                # [..., :n] cuts the last (sequence) axis of (L,) and mrope (3|4, L) rows alike.
                trimmed[key] = [row[..., :n] for row, n in zip(data[key].unbind(0), prompt_lens)]
            elif key in ("routed_experts", "teacher_ids", "teacher_logprobs"):
                trimmed[key] = [row[:n] for row, n in zip(data[key].unbind(0), prompt_lens)]
            elif key in ("responses", "response_mask", "loss_mask", "rollout_log_probs"):
                trimmed[key] = [row[:0] for row in data[key].unbind(0)]
        rows = [{key: values[i] for key, values in trimmed.items()} for i in range(len(batch))]
        # Stacked the way AgentLoopWorkerTQ stores them: jagged where lengths differ.
        tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=tu.list_of_dict_to_tensordict(rows))
        return batch

    # The switch reader (patches/_shared/switches.py): PROMPTS_ONLY read once per process.
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
