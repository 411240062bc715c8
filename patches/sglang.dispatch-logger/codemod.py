"""Anchors of `sglang.dispatch-logger`.

- `DispatchLoggerModule`: the new file sglang/srt/model_executor/dispatch_logger.py.
- `LogAfterForward` (every release 0.4.6.post5 to 0.5.23): in `ModelRunner.forward`, right
  after the `with ...with_forward_pass(...)` block that runs the model (one `with` item in
  0.4.6 to 0.5.10, parenthesised with the step span in 0.5.11, and the canary in 0.5.23): the
  forward has run, the debugger (started after `self.forward_pass_id += 1`, by SGLang itself
  from 0.5.11 or by sglang.model-runner before) has not stopped yet. The anchor is neither of
  sglang.model-runner's, so the two patches sit in one file without touching each other.
"""

import libcst as cst
import libcst.matchers as m

from rlprobe_patch.codemod import METHOD, CreateFile, Hook, PatchCodemod, Where

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
