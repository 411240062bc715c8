"""Anchors of `verl.request-id`: the one `server.generate.remote(request_id=..., ...)` call.

- 0.7.1: `AsyncLLMServerManager.generate` in verl/experimental/agent_loop/agent_loop.py,
  `request_id=uuid4().hex`.
- 0.8.0: `LLMServerClient.generate` in verl/workers/rollout/llm_server.py, `request_id=uuid4().hex`;
  0.9.0+: `request_id=self._vllm_request_id(request_id)`.

- The fully-async client (`FullyAsyncLLMServerClient.generate`, in
  verl/experimental/fully_async_policy/fully_async_rollouter.py in 0.8.0 and in
  llm_server.py from 0.9.0) builds its own `final_output` across resumed requests: after
  each `output = await super().generate(...)` the first request id is copied into it.

Before 0.7.1 `TokenOutput` has no `extra_fields`, so there is nowhere to carry the id.
"""

import libcst as cst
import libcst.matchers as m

from rlprobe_patch.codemod import ANY, HoistKeyword, Hook, PatchCodemod, Where, contains

SERVER_CALL = m.Call(func=m.Attribute(value=m.Attribute(attr=m.Name("generate")), attr=m.Name("remote")))


def calls_server(stmt: cst.BaseStatement) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and contains(stmt, SERVER_CALL)


def output_name(stmt: cst.BaseStatement) -> dict[str, cst.BaseExpression]:
    small = stmt.body[0]  # type: ignore[attr-defined]
    target = small.target if isinstance(small, cst.AnnAssign) else small.targets[0].target
    return {"output": target}


def operations(cls: str) -> tuple:
    return (
        HoistKeyword(
            cls,
            "generate",
            SERVER_CALL,
            "request_id",
            "vllm_request_id",
            expected="`server.generate.remote(request_id=...)` call",
        ),
        Hook(
            cls,
            "generate",
            "keep_request_id",
            Where.AFTER,
            ANY,
            anchor=calls_server,
            expected="`output = await server.generate.remote(...)` statement",
            template=output_name,
        ),
    )


class AgentLoopClient(PatchCodemod):
    DESCRIPTION = "AsyncLLMServerManager.generate keeps the engine's request id in extra_fields"
    OPERATIONS = operations("AsyncLLMServerManager")


class LLMServerClient(PatchCodemod):
    DESCRIPTION = "LLMServerClient.generate keeps the engine's request id in extra_fields"
    OPERATIONS = operations("LLMServerClient")


SUPER_GENERATE = m.Await(m.Call(func=m.Attribute(value=m.Call(func=m.Name("super")), attr=m.Name("generate"))))


def awaits_super_generate(stmt: cst.BaseStatement) -> bool:
    return m.matches(
        stmt, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(m.Name("output"))], value=SUPER_GENERATE)])
    )


class FullyAsyncClient(PatchCodemod):
    DESCRIPTION = "FullyAsyncLLMServerClient.generate carries the first request id into its merged output"
    OPERATIONS = (
        Hook(
            "FullyAsyncLLMServerClient",
            "generate",
            "keep_first_request_id",
            Where.AFTER,
            ANY,
            anchor=awaits_super_generate,
            expected="`output = await super().generate(...)`",
        ),
    )
