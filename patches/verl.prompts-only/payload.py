"""What `verl.prompts-only` inserts into verl's PPO trainers.

With `PROMPTS_ONLY=1`, the batch is cut down to its prompts just before the old-log-prob
pass, so that the training side computes log-probs over exactly the tokens the rollout
engine prefilled: `input_ids`, `attention_mask` and `position_ids` (2-D, or 3-D for mrope)
lose their response columns; `responses`, `rollout_log_probs` and `response_mask` become
width 0. Unset, nothing changes and nothing is imported.

The skill's `check-consistency-patch` looks for `PROMPTS_ONLY`, `compute_prompts_only` and
`responses_len` in ray_trainer.py: those names are kept.
"""

import os


class RayPPOTrainer:
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


def trim_before_old_log_prob(self, batch):
    """In `RayPPOTrainer.fit`, right before the `with marked_timer("old_log_prob", ...)` block."""
    compute_prompts_only = int(os.getenv("PROMPTS_ONLY", "0"))  # rlprobe-patch
    if compute_prompts_only:
        batch = self._prompts_only_batch(batch)


def trim_after_samples(self, batch):
    """In `FullyAsyncTrainer._fit_generate`, right before `batch.meta_info["temperature"] = ...`."""
    compute_prompts_only = int(os.getenv("PROMPTS_ONLY", "0"))  # rlprobe-patch
    if compute_prompts_only and "responses" in batch.batch.keys():
        batch = self._prompts_only_batch(batch)
