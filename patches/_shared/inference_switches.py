"""The inference side's reading of the switches, for the SGLang hook (`sglang.model-runner`).

An SGLang server inherits the training job's environment (verl's and slime's launchers pass it
to every process), but it dumps every forward pass its msprobe config asks for: `DUMP_PHASE`
belongs to the training hooks, and verl and slime give it different grammars (slime: a
comma-separated list of its passes). The SGLang hook takes the shared switch reader
(`patches/_shared/switches.py`) with this one method in place of `Switches._rlprobe_switches`:

- `DUMP_ON`, `PROMPTS_ONLY`: as everywhere (the shared `_rlprobe_switch`).
- `DUMP_PHASE`: not used here; still a typo stops the run: each comma-separated item must be a
  pass of verl's (`log_prob`, `update_actor`, `all`) or slime's (`ref_forward`,
  `teacher_forward`, `critic_forward`, `update_critic`) hooks.
- No warnings: PROMPTS_ONLY and the phase are the training side's business, and it warns.
"""


class InferenceSwitches:
    """The inference hooks' switch reader: the method here is inserted as it is written."""

    def _rlprobe_switches(self, environ=None):
        # The switches an inference hook reads: {"dump_on", "prompts_only", "phase", "warnings"};
        # DUMP_PHASE is the training side's (verl's or slime's grammar): only checked for typos.
        import os

        env = os.environ if environ is None else environ
        dump_on = self._rlprobe_switch("DUMP_ON", env)
        prompts_only = self._rlprobe_switch("PROMPTS_ONLY", env)
        raw_phase = env.get("DUMP_PHASE", "")
        passes = (
            "log_prob",
            "update_actor",
            "all",
            "ref_forward",
            "teacher_forward",
            "critic_forward",
            "update_critic",
        )
        phases = tuple(item.strip().lower() for item in raw_phase.split(",") if item.strip()) or ("log_prob",)
        unknown = [item for item in phases if item not in passes]
        if unknown:
            raise ValueError(
                f"rlprobe-patch: DUMP_PHASE={raw_phase!r}{self._rlprobe_on_rank(env)}: "
                f"{', '.join(unknown)} is not a pass of verl's or slime's hooks: use "
                f"{', '.join(passes[:3])} (verl) or a comma-separated list of {', '.join(passes)} (slime)"
            )
        return {"dump_on": dump_on, "prompts_only": prompts_only, "phase": ",".join(phases), "warnings": []}
