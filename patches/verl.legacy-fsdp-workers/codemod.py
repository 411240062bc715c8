"""Anchors of `verl.legacy-fsdp-workers` in `DataParallelPPOActor` (verl/workers/actor/dp_actor.py).

The legacy FSDP worker (`fsdp_workers.ActorRolloutRefWorker`) runs every actor log-prob pass
and update through this class, so the hooks sit here, where the micro-batches are. The same
shape in every release 0.6.0 to 0.7.1:

- `compute_log_prob` and `update_policy` each hold one `for micro_batch in micro_batches:`
  loop (in `update_policy` nested inside the epoch and mini-batch loops), without
  `continue`/`break`, so the end of its body is the end of the micro-batch (after
  `loss.backward()`, or the `scaler` if/else of 0.6.1+);
- each calls `data = data.select(batch_keys=..., non_tensor_batch_keys=<name>)` once before it.

`compute_log_prob` returns a tuple up to 0.7.0 and a dict in 0.7.1; no hook depends on it.
"""

import libcst as cst
import libcst.matchers as m

from rlprobe_patch.codemod import METHOD, AddMethods, ConfigPathParam, Hook, Where

CLS = "DataParallelPPOActor"
MICRO_BATCH_LOOP = m.For(target=m.Name("micro_batch"), iter=m.Name("micro_batches"))

SELECT = m.SimpleStatementLine(
    body=[
        m.Assign(
            targets=[m.AssignTarget(m.Name("data"))],
            value=m.Call(
                func=m.Attribute(value=m.Name("data"), attr=m.Name("select")),
                args=[
                    m.ZeroOrMore(),
                    m.Arg(keyword=m.Name("non_tensor_batch_keys"), value=m.Name()),
                    m.ZeroOrMore(),
                ],
            ),
        )
    ]
)


def is_micro_batch_loop(stmt: cst.BaseStatement) -> bool:
    return m.matches(stmt, MICRO_BATCH_LOOP)


def is_select(stmt: cst.BaseStatement) -> bool:
    return m.matches(stmt, SELECT)


def non_tensor_keys_name(stmt: cst.BaseStatement) -> dict[str, cst.BaseExpression]:
    call = stmt.body[0].value  # type: ignore[attr-defined]
    arg = next(a for a in call.args if a.keyword is not None and a.keyword.value == "non_tensor_batch_keys")
    return {"non_tensor_keys": arg.value}


def micro_batch_hooks(method: str, prologue: str) -> tuple[Hook, ...]:
    loop = f"one `for micro_batch in micro_batches:` loop in {method}"
    return (
        Hook(CLS, method, prologue, Where.START, METHOD, expected="the method body"),
        Hook(
            "DataParallelPPOActor",
            method,
            "keep_request_ids",
            Where.BEFORE,
            METHOD,
            anchor=is_select,
            expected="`data = data.select(..., non_tensor_batch_keys=<name>)` in the method body",
            template=non_tensor_keys_name,
        ),
        Hook(
            "DataParallelPPOActor", method, "start_micro_batch", Where.START, block=is_micro_batch_loop, expected=loop
        ),
        Hook(CLS, method, "finish_micro_batch", Where.END, block=is_micro_batch_loop, expected=loop),
    )


class Codemod(ConfigPathParam):
    DESCRIPTION = "msprobe dump hooks around each micro-batch of the legacy FSDP actor (DataParallelPPOActor)"
    REQUIRES_MODULE_NAMES = ("os", "logger", "torch")
    OPERATIONS = (
        AddMethods(CLS),
        Hook(CLS, "__init__", "init_debugger_state", Where.END, METHOD, expected="the method body"),
        *micro_batch_hooks("compute_log_prob", "log_prob_prologue"),
        *micro_batch_hooks("update_policy", "update_prologue"),
    )
