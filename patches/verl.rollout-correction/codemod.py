"""Anchor of `verl.rollout-correction`: the module-level function
`compute_rollout_correction_and_add_to_batch` of verl/trainer/ppo/rollout_corr_helper.py (0.6.1+)."""

from rlprobe_patch.codemod import METHOD, AddDefinitions, Hook, PatchCodemod, Where


class Codemod(PatchCodemod):
    DESCRIPTION = "compute_rollout_correction_and_add_to_batch returns at once under PROMPTS_ONLY"
    OPERATIONS = (
        AddDefinitions(("_RlprobeSwitches",)),
        Hook(
            None,
            "compute_rollout_correction_and_add_to_batch",
            "return_unchanged_under_prompts_only",
            Where.START,
            METHOD,
            expected="the body",
        ),
    )
