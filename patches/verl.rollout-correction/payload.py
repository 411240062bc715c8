"""What `verl.rollout-correction` inserts at the top of `compute_rollout_correction_and_add_to_batch`.

Under PROMPTS_ONLY there are no responses to correct: hand the batch back unchanged with no
metrics, as the skill's design does. The skill's checker looks for `PROMPTS_ONLY` in
verl/trainer/ppo/rollout_corr_helper.py. `PROMPTS_ONLY` is read by the shared switch reader,
appended to the module as the class `_RlprobeSwitches` (the hook is a module-level function).
"""

from _shared.switches import Switches


def return_unchanged_under_prompts_only(batch):
    """First statements of `compute_rollout_correction_and_add_to_batch` (after its docstring)."""
    if _RlprobeSwitches()._rlprobe_run_switches()["prompts_only"]:  # rlprobe-patch: PROMPTS_ONLY
        return batch, {}


class _RlprobeSwitches:
    # Added by rlprobe-patch (verl.rollout-correction); `rlprobe-patch revert` removes it.
    # The switch reader (patches/_shared/switches.py) for the hook at the top of
    # `compute_rollout_correction_and_add_to_batch`, a module-level function.
    _rlprobe_on_rank = Switches._rlprobe_on_rank
    _rlprobe_switch = Switches._rlprobe_switch
    _rlprobe_switches = Switches._rlprobe_switches
    _rlprobe_run_switches = Switches._rlprobe_run_switches
