"""Anchor of `verl.debug-metrics`: the module-level function `calculate_debug_metrics` (0.6.0+)."""

from rlprobe_patch.codemod import METHOD, AddDefinitions, Hook, PatchCodemod, Where


class Codemod(PatchCodemod):
    DESCRIPTION = "calculate_debug_metrics returns zeroed metrics under PROMPTS_ONLY or without responses"
    REQUIRES_MODULE_NAMES = ("logger",)
    OPERATIONS = (
        AddDefinitions(("_RlprobeSwitches",)),
        Hook(None, "calculate_debug_metrics", "skip_without_responses", Where.START, METHOD, expected="the body"),
    )
