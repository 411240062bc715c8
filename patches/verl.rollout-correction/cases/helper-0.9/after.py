# Case: verl 0.9.x: the function is one of several, its body starts with a comment.
import math


def apply_bypass_mode(batch, rollout_corr_config, policy_loss_config):
    batch.batch["old_log_probs"] = batch.batch["rollout_log_probs"]


def compute_rollout_correction_and_add_to_batch(batch, rollout_corr_config):
    if _RlprobeSwitches()._rlprobe_run_switches()["prompts_only"]:  # rlprobe-patch: PROMPTS_ONLY
        return batch, {}
    # Compute importance weights first.
    rollout_corr_metrics = {}
    return batch, rollout_corr_metrics


class _RlprobeSwitches:
    # Added by rlprobe-patch (verl.rollout-correction); `rlprobe-patch revert` removes it.
    # The switch reader (patches/_shared/switches.py) for the hook at the top of
    # `compute_rollout_correction_and_add_to_batch`, a module-level function.
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
