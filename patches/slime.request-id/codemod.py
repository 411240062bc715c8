"""Anchors of `slime.request-id` (slime/rollout/sglang_rollout.py).

In every release 0.2.2 to 0.3.1, the module-level `async def generate(args, sample,
sampling_params)` builds the SGLang request as one `payload = {...}` dict display, then adds
optional keys (`return_routed_experts`, `image_data`, `input_ids` or `text`) and posts it.
"""

import libcst.matchers as m

from rlprobe_patch.codemod import METHOD, AddDefinitions, Hook, PatchCodemod, Where


def _builds_payload(stmt) -> bool:
    """`payload = {...}`."""
    return m.matches(
        stmt, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(m.Name("payload"))], value=m.Dict())])
    )


class Codemod(PatchCodemod):
    DESCRIPTION = "a deterministic SGLang rid per sample and attempt in slime's rollout, kept in the sample's metadata"
    OPERATIONS = (
        AddDefinitions(("_RlprobeSwitches",)),
        Hook(
            None,
            "generate",
            "send_request_id",
            Where.AFTER,
            METHOD,
            anchor=_builds_payload,
            expected="`payload = {...}` in the body of `generate`",
        ),
    )
