# Case: from 0.6.1 the old-log-prob pass sits in the recompute branch of the bypass switch.
import os


class RayPPOTrainer:
    def _compute_old_log_prob(self, batch):
        return self.actor_rollout_wg.compute_log_prob(batch), 0

    def fit(self):
        for batch_dict in self.train_dataloader:
            with marked_timer("step", timing_raw):
                bypass_recomputing_logprobs = rollout_corr_config and rollout_corr_config.get("bypass_mode", False)
                if bypass_recomputing_logprobs:  # Use `rollout_log_probs`
                    apply_bypass_mode(batch=batch)
                else:  # Recompute old_log_probs
                    compute_prompts_only = self._rlprobe_run_switches()["prompts_only"]  # rlprobe-patch: PROMPTS_ONLY
                    if compute_prompts_only:
                        batch = self._prompts_only_batch(batch)
                    with marked_timer("old_log_prob", timing_raw, color="blue"):
                        old_log_prob, old_log_prob_mfu = self._compute_old_log_prob(batch)

    # Added by rlprobe-patch (verl.prompts-only); `rlprobe-patch revert` removes it.
    def _prompts_only_batch(self, data):
        responses_len = data.batch["responses"].size(1)
        if responses_len:
            for key in ("input_ids", "attention_mask", "position_ids"):
                if key in data.batch.keys():
                    # [..., :-n] cuts the last (sequence) axis of 2-D and 3-D tensors alike.
                    data.batch[key] = data.batch[key][..., :-responses_len]
        for key in ("responses", "rollout_log_probs", "response_mask"):
            if key in data.batch.keys():
                data.batch[key] = data.batch[key][:, :0]
        return data

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
