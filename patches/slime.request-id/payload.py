"""What `slime.request-id` inserts into `slime/rollout/sglang_rollout.py`.

slime's `generate` posts each sample to SGLang's `/generate` without a `rid`, and does not keep
the id SGLang makes up, so a forward pass of SGLang cannot be tied to a training sample. With
`DUMP_ON=1` in the rollout's environment, the hook sends a deterministic id per sample and
attempt, from slime's own `Sample.index` (a global counter that reaches training as
`sample_indices`):

- `slime-<index>` for the sample's first request (its prompt's prefill), the id
  `slime.megatron-actor` logs for the sample's training steps;
- `slime-<index>-<n>` for the n-th later request of the same sample (a partial rollout resumed,
  a multi-turn continuation).

Every id sent is kept in order in `sample.metadata["rlprobe_request_ids"]`, so it reaches
slime's debug rollout dump (`--save-debug-rollout-data`). Unset `DUMP_ON`: the payload is the
original one (SGLang picks random ids). Eval samples restart their indices at 0, so keep eval
off while collecting (SGLang refuses a duplicate id among requests in flight).

`DUMP_ON` (`1`, `true`, `yes`, `on`) and slime's `DUMP_PHASE` list are read by the shared switch
reader once per process, at the first request: any other value stops the rollout there with an
error naming the variable. The reader is appended to the module as the class `_RlprobeSwitches`
(the hook is in a module-level function: there is no class of ours to add the methods to).
"""

from _shared.slime_switches import SlimeSwitches
from _shared.switches import Switches


def send_request_id(sample, payload):
    """Right after `payload = {...}` in `generate`."""
    if (
        _RlprobeSwitches()._rlprobe_run_switches()["dump_on"]  # rlprobe-patch: DUMP_ON
        and sample.index is not None
        and isinstance(sample.metadata, dict)
    ):
        _rlprobe_request_ids = sample.metadata.setdefault("rlprobe_request_ids", [])
        payload["rid"] = f"slime-{sample.index}" + (f"-{len(_rlprobe_request_ids)}" if _rlprobe_request_ids else "")
        _rlprobe_request_ids.append(payload["rid"])


class _RlprobeSwitches:
    # Added by rlprobe-patch (slime.request-id); `rlprobe-patch revert` removes it.
    # The switch reader (patches/_shared/switches.py, with slime's DUMP_PHASE list) for the hook
    # in `generate`, a module-level function.
    _rlprobe_on_rank = Switches._rlprobe_on_rank
    _rlprobe_switch = Switches._rlprobe_switch
    _rlprobe_switches = SlimeSwitches._rlprobe_switches
    _rlprobe_run_switches = Switches._rlprobe_run_switches
