"""Anchors of `sglang.dispatch-logger`.

- `DispatchLoggerModule`: the new file sglang/srt/model_executor/dispatch_logger.py.
- `LogAfterForward` (every release 0.4.6.post5 to 0.5.23): in `ModelRunner.forward`, right
  after the `with ...with_forward_pass(...)` block that runs the model (one `with` item in
  0.4.6 to 0.5.10, parenthesised with the step span in 0.5.11, and the canary in 0.5.23): the
  forward has run, the debugger (started after `self.forward_pass_id += 1`, by SGLang itself
  from 0.5.11 or by sglang.model-runner before) has not stopped yet. The anchor is neither of
  sglang.model-runner's, so the two patches sit in one file without touching each other.
- `RidsFromWorkerBatch` (0.5.8 and 0.5.9): in `ForwardBatch.init_new`, right after
  `ret = cls(...)`: the rids of the `ModelWorkerBatch.reqs` those releases always pass,
  as the `rids` attribute that 0.5.10 made a field.
- `RidsFromScheduler` (before 0.5.8, scheduler.py): in `Scheduler.run_batch`, right after
  `model_worker_batch = batch.get_model_worker_batch()` (`batch_or_worker_batch` in 0.5.3) in
  the `if self.spec_algorithm.is_none():` block (the embedding branch builds one too: not
  hooked): the `ScheduleBatch`'s rids on the `ModelWorkerBatch`, which has no requests yet.
- `RidsFromSchedulerBatch` (before 0.5.8, forward_batch_info.py): in `ForwardBatch.init_new`,
  right after `ret = cls(...)`: those rids, as `rids`.
"""

import libcst as cst
import libcst.matchers as m

from rlprobe_patch.codemod import METHOD, CreateFile, Hook, PatchCodemod, Where, assigns_call

WITH_FORWARD_PASS = m.Call(func=m.Attribute(attr=m.Name("with_forward_pass")))


def runs_forward_pass(stmt: cst.BaseStatement) -> bool:
    """The `with` whose items enter the expert-distribution recorder's `with_forward_pass(...)`."""
    return isinstance(stmt, cst.With) and any(m.findall(item.item, WITH_FORWARD_PASS) for item in stmt.items)


class DispatchLoggerModule(CreateFile):
    DESCRIPTION = "the SGLang DispatchLogger module"
    FILE = "dispatch_logger.py"


class LogAfterForward(PatchCodemod):
    DESCRIPTION = "dispatch log after each ModelRunner.forward pass, before the msprobe step closes"
    OPERATIONS = (
        Hook(
            "ModelRunner",
            "forward",
            "log_forward",
            Where.AFTER,
            METHOD,
            anchor=runs_forward_pass,
            expected="`with ...with_forward_pass(...)` in the method body",
        ),
    )


class RidsFromWorkerBatch(PatchCodemod):
    DESCRIPTION = "ForwardBatch.rids from ModelWorkerBatch.reqs (0.5.8, 0.5.9)"
    OPERATIONS = (
        Hook(
            "ForwardBatch",
            "init_new",
            "keep_rids",
            Where.AFTER,
            METHOD,
            anchor=assigns_call("ret", m.Call(func=m.Name("cls"))),
            expected="`ret = cls(...)` in the method body",
        ),
    )


GET_MODEL_WORKER_BATCH = m.Call(func=m.Attribute(value=m.Name("batch"), attr=m.Name("get_model_worker_batch")))
SPEC_NONE = m.Call(
    func=m.Attribute(value=m.Attribute(value=m.Name("self"), attr=m.Name("spec_algorithm")), attr=m.Name("is_none"))
)


def builds_worker_batch(stmt: cst.BaseStatement) -> bool:
    """`<name> = batch.get_model_worker_batch()`."""
    return m.matches(
        stmt, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(m.Name())], value=GET_MODEL_WORKER_BATCH)])
    )


def worker_batch_name(stmt: cst.BaseStatement) -> dict[str, cst.BaseExpression]:
    return {"worker_batch": stmt.body[0].targets[0].target}  # type: ignore[attr-defined]


def is_generation_without_speculation(stmt: cst.CSTNode) -> bool:
    """The block of `if self.spec_algorithm.is_none():`."""
    return isinstance(stmt, cst.If) and m.matches(stmt.test, SPEC_NONE)


class RidsFromScheduler(PatchCodemod):
    DESCRIPTION = "the ScheduleBatch's rids on its ModelWorkerBatch (before 0.5.8)"
    OPERATIONS = (
        Hook(
            "Scheduler",
            "run_batch",
            "keep_scheduler_rids",
            Where.AFTER,
            block=is_generation_without_speculation,
            anchor=builds_worker_batch,
            expected="`<name> = batch.get_model_worker_batch()` in an `if self.spec_algorithm.is_none():` block",
            template=worker_batch_name,
        ),
    )


class RidsFromSchedulerBatch(PatchCodemod):
    DESCRIPTION = "ForwardBatch.rids from the rids the scheduler put on the ModelWorkerBatch (before 0.5.8)"
    OPERATIONS = (
        Hook(
            "ForwardBatch",
            "init_new",
            "rids_from_scheduler",
            Where.AFTER,
            METHOD,
            anchor=assigns_call("ret", m.Call(func=m.Name("cls"))),
            expected="`ret = cls(...)` in the method body",
        ),
    )
