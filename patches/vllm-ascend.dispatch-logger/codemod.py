"""Anchors of `vllm-ascend.dispatch-logger`.

- `DispatchLoggerModule`: the new file vllm_ascend/worker/dispatch_logger.py (every release).
- `InlineStops` (0.12.0rc1 to 0.19.x): every `if ...:` block whose body calls
  `self.debugger.stop()` directly (`if self.debugger is not None:` from 0.13,
  `if need_dump:` in 0.12), in `execute_model` and in `sample_tokens`.
- `FinalizeHelper` (0.20.2rc1+): `self._start_dump_data()` in `execute_model` and
  `self.debugger.step(**kwargs)` in `_finalize_dump_data`.
"""

import libcst as cst
import libcst.matchers as m

from rlprobe_patch.codemod import ANY, METHOD, AddMethods, CreateFile, Hook, PatchCodemod, Where

DEBUGGER = m.Attribute(value=m.Name("self"), attr=m.Name("debugger"))
STOP = m.SimpleStatementLine(body=[m.Expr(m.Call(func=m.Attribute(value=DEBUGGER, attr=m.Name("stop"))))])
STEP = m.SimpleStatementLine(body=[m.Expr(m.Call(func=m.Attribute(value=DEBUGGER, attr=m.Name("step"))))])
START_DUMP = m.SimpleStatementLine(
    body=[m.Expr(m.Call(func=m.Attribute(value=m.Name("self"), attr=m.Name("_start_dump_data"))))]
)


def stops_debugger(stmt: cst.BaseStatement) -> bool:
    """An `if` whose own body (not a nested block) calls `self.debugger.stop()`."""
    return (
        isinstance(stmt, cst.If)
        and isinstance(stmt.body, cst.IndentedBlock)
        and any(m.matches(s, STOP) for s in stmt.body.body)
    )


INIT = Hook("NPUModelRunner", "__init__", "create_dispatch_logger", Where.END, METHOD, expected="the method body")


class DispatchLoggerModule(CreateFile):
    DESCRIPTION = "the DispatchLogger module"
    FILE = "dispatch_logger.py"


class InlineStops(PatchCodemod):
    DESCRIPTION = "dispatch log before every debugger stop of execute_model and sample_tokens (0.12 to 0.19)"
    REQUIRES_MODULE_NAMES = ("torch",)
    OPERATIONS = (
        AddMethods("NPUModelRunner"),
        INIT,
        *(
            Hook(
                "NPUModelRunner",
                method,
                "log_before_stop",
                Where.BEFORE,
                ANY,
                anchor=stops_debugger,
                expected="`if ...: self.debugger.stop()` blocks",
                many=True,
            )
            for method in ("execute_model", "sample_tokens")
        ),
    )


class FinalizeHelper(PatchCodemod):
    DESCRIPTION = "dispatch log in _finalize_dump_data, the single debugger stop of 0.20.2rc1 and later"
    REQUIRES_MODULE_NAMES = ("torch",)
    OPERATIONS = (
        AddMethods("NPUModelRunner"),
        INIT,
        Hook(
            "NPUModelRunner",
            "execute_model",
            "stash_scheduler_output",
            Where.AFTER,
            ANY,
            anchor=lambda stmt: m.matches(stmt, START_DUMP),
            expected="`self._start_dump_data()`",
        ),
        Hook(
            "NPUModelRunner",
            "_finalize_dump_data",
            "log_in_finalize",
            Where.BEFORE,
            METHOD,
            anchor=lambda stmt: m.matches(stmt, STEP),
            expected="`self.debugger.step(**kwargs)` in the method body",
        ),
    )
