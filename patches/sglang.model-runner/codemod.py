"""Anchors of `sglang.model-runner` in `ModelRunner` (the same in every release 0.4.6.post5 to 0.5.10.post1):

- `__init__`: its first statement (the `# Parse args` block starts there);
- `forward`: `self.forward_pass_id += 1` (its first statement) and the single `return output`.
"""

import libcst as cst
import libcst.matchers as m

from rlprobe_patch.codemod import METHOD, AddMethods, ConfigPathParam, Hook, Where

COUNT_FORWARD_PASS = m.SimpleStatementLine(
    body=[m.AugAssign(target=m.Attribute(value=m.Name("self"), attr=m.Name("forward_pass_id")))]
)
RETURN_OUTPUT = m.SimpleStatementLine(body=[m.Return(value=m.Name("output"))])


def counts_forward_pass(stmt: cst.BaseStatement) -> bool:
    return m.matches(stmt, COUNT_FORWARD_PASS)


def returns_output(stmt: cst.BaseStatement) -> bool:
    return m.matches(stmt, RETURN_OUTPUT)


class Codemod(ConfigPathParam):
    DESCRIPTION = "msprobe debugger around each ModelRunner.forward pass (SGLang < 0.5.11)"
    ENV_VAR = "MSPROBE_SGLANG_CONFIG"
    PARAM = "sglang_config"
    PARAMS = {"sglang_config": "./config.json"}
    REQUIRES_MODULE_NAMES = ("os", "logger")
    OPERATIONS = (
        AddMethods("ModelRunner"),
        Hook("ModelRunner", "__init__", "create_debugger", Where.START, METHOD, expected="the method body"),
        Hook(
            "ModelRunner",
            "forward",
            "start_forward",
            Where.AFTER,
            METHOD,
            anchor=counts_forward_pass,
            expected="`self.forward_pass_id += 1` in the method body",
        ),
        Hook(
            "ModelRunner",
            "forward",
            "finish_forward",
            Where.BEFORE,
            METHOD,
            anchor=returns_output,
            expected="`return output` in the method body",
        ),
    )
