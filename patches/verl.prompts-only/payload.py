"""What `verl.prompts-only` inserts into verl's PPO trainers.

With `PROMPTS_ONLY` on (`1`, `true`, `yes`, `on`: the shared switch reader), the batch is cut down to its prompts just before the old-log-prob
pass, so that the training side computes log-probs over exactly the tokens the rollout
engine prefilled: `input_ids`, `attention_mask` and `position_ids` (2-D, or 3-D for mrope)
lose their response columns; `responses`, `rollout_log_probs` and `response_mask` become
width 0. Unset, nothing changes and nothing is imported.

The V1 trainer (0.9.0+) holds no batch: `PPOTrainer._step_once` passes a `KVBatchMeta`, keys
into TransferQueue, whose rows are one sample each (jagged, as `AgentLoopWorkerTQ` stores them).
There the rows are fetched, each cut to its prompt, and put back under the same keys; unset, the
inserted code does not touch TransferQueue. The fields and the axis each is cut on are those of
verl's own padding template (`verl/trainer/ppo/padding_utils.py`): `routed_experts` and
`teacher_*` span the whole sequence there, so they are cut to the prompt like `input_ids`.

The skill's `check-consistency-patch` looks for `PROMPTS_ONLY`, `compute_prompts_only` and
`responses_len` in ray_trainer.py: those names are kept.
"""

from _shared.switches import Switches


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

    # The switch reader (patches/_shared/switches.py): PROMPTS_ONLY read once per process.
    _rlprobe_on_rank = Switches._rlprobe_on_rank
    _rlprobe_switch = Switches._rlprobe_switch
    _rlprobe_switches = Switches._rlprobe_switches
    _rlprobe_run_switches = Switches._rlprobe_run_switches


class PPOTrainer:
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
    _rlprobe_on_rank = Switches._rlprobe_on_rank
    _rlprobe_switch = Switches._rlprobe_switch
    _rlprobe_switches = Switches._rlprobe_switches
    _rlprobe_run_switches = Switches._rlprobe_run_switches


def trim_before_old_log_prob(self, batch):
    """In `RayPPOTrainer.fit`, right before the `with marked_timer("old_log_prob", ...)` block."""
    compute_prompts_only = self._rlprobe_run_switches()["prompts_only"]  # rlprobe-patch: PROMPTS_ONLY
    if compute_prompts_only:
        batch = self._prompts_only_batch(batch)


def trim_after_samples(self, batch):
    """In `FullyAsyncTrainer._fit_generate`, right before `batch.meta_info["temperature"] = ...`."""
    compute_prompts_only = self._rlprobe_run_switches()["prompts_only"]  # rlprobe-patch: PROMPTS_ONLY
    if compute_prompts_only and "responses" in batch.batch.keys():
        batch = self._prompts_only_batch(batch)


def trim_before_separate_old_log_prob(self, batch):
    """In `SeparateRayPPOTrainer._fit_compute_log_prob` (0.7.1+), right before the
    `with marked_timer("old_log_prob", ...)` block."""
    compute_prompts_only = self._rlprobe_run_switches()["prompts_only"]  # rlprobe-patch: PROMPTS_ONLY
    if compute_prompts_only:
        batch = self._prompts_only_batch(batch)


def trim_kv_batch_before_old_log_prob(self, batch):
    """In `PPOTrainer._step_once` (V1 trainer, 0.9.0+), after `_balance_batch`, right before the
    `with marked_timer("old_log_prob", ...)` block."""
    compute_prompts_only = self._rlprobe_run_switches()["prompts_only"]  # rlprobe-patch: PROMPTS_ONLY
    if compute_prompts_only:
        batch = self._prompts_only_kv_batch(batch)
