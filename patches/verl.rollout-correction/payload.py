"""What `verl.rollout-correction` inserts at the top of `compute_rollout_correction_and_add_to_batch`.

Under PROMPTS_ONLY there are no responses to correct: hand the batch back unchanged with no
metrics, as the skill's design does. The skill's checker looks for `PROMPTS_ONLY` in
verl/trainer/ppo/rollout_corr_helper.py.
"""


def return_unchanged_under_prompts_only(batch):
    """First statements of `compute_rollout_correction_and_add_to_batch` (after its docstring)."""
    import os  # rlprobe-patch: rollout_corr_helper.py does not import os

    if int(os.getenv("PROMPTS_ONLY", "0")):
        return batch, {}
