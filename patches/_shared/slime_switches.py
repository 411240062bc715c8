"""slime's reading of `DUMP_PHASE`, for the slime hooks (`slime.megatron-actor`, `slime.request-id`).

slime's hooks take the shared switch reader (`patches/_shared/switches.py`: `DUMP_ON`,
`PROMPTS_ONLY`, the msprobe config, the once-per-process cache and the announce line) with this
one method in place of `Switches._rlprobe_switches`: slime runs more passes than verl's actor, so
its `DUMP_PHASE` is a comma-separated list of them. `_rlprobe_run_switches` calls it by name.

- `DUMP_PHASE`: items among `log_prob` (the default when unset or empty), `update_actor`, `all`
  (both of the actor's), `ref_forward`, `teacher_forward`, `critic_forward`, `update_critic`
  (any case, blanks and empty items ignored); any other item is an error that names the
  variable, the value, the item and the allowed items.
"""


class SlimeSwitches:
    """slime's switch reader: the method here is inserted as it is written."""

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
