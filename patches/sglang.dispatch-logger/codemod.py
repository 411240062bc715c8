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
