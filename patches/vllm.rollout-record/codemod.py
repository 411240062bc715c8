"""Anchors of `vllm.rollout-record`: where vLLM's V1 scheduler frees a finished request.

`Scheduler._free_request(self, request, ...)` in vllm/v1/core/sched/scheduler.py, every tested
release 0.8.5 to 0.32.0 and the `vllm` wheels of 0.33.0 and 0.34.0 (`AsyncScheduler` and the
diffusion schedulers inherit it): the record goes right after its first statement,
`assert request.is_finished()`, before the KV connector, the encoder cache and the KV blocks let go
of anything. It is called once per request, from `update_from_output` (stopped: stop token, length,
an error) and from `finish_requests` (aborted by the client or the frontend), so every request the
engine took is recorded once.
"""

import libcst.matchers as m

from rlprobe_patch.codemod import METHOD, AddDefinitions, Hook, PatchCodemod, Where

ASSERTS_FINISHED = m.SimpleStatementLine(
    body=[m.Assert(test=m.Call(func=m.Attribute(value=m.Name("request"), attr=m.Name("is_finished"))))]
)


class Codemod(PatchCodemod):
    DESCRIPTION = "Scheduler._free_request records each finished request (ids in and out, sampling, dtype)"
    OPERATIONS = (
        AddDefinitions(("_RlprobeRolloutRecord",)),
        Hook(
            "Scheduler",
            "_free_request",
            "record_finished_request",
            Where.AFTER,
            METHOD,
            anchor=lambda stmt: m.matches(stmt, ASSERTS_FINISHED),
            expected="`assert request.is_finished()` in the method body",
            parameters=("request",),
        ),
    )
