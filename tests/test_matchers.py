"""`rlprobe_patch.matchers` answers what `libcst.matchers` answers, on every node of our fixture trees.

The codemods' anchors moved from `libcst.matchers` (0.12 s to import) to our small module;
each pattern below is built with both modules from one spelling: the anchors of the patches
(copied from their `codemod.py`) and patterns for each rule (fields by position and by name,
strings, `None`, `DoNotCare`, lists with and without `ZeroOrMore`, `|`). For every node of
every fixture file, `matches` must agree, `findall` must find the same nodes (the order may
differ: ours lists in field order) and `replace` must give the same code. The fixtures are
our own stand-ins of verl/SGLang/slime files (fixtures/), not upstream code.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import libcst as cst
import libcst.matchers as libcst_m
import pytest
from conftest import FIXTURES

from rlprobe_patch import matchers as ours

PATTERNS: dict[str, Callable[[Any], Any]] = {
    # The patches' anchors.
    "old_log_prob_timer": lambda m: m.Call(
        func=m.Name("marked_timer"), args=[m.Arg(m.SimpleString('"old_log_prob"')), m.ZeroOrMore()]
    ),
    "with_old_log_prob": lambda m: m.With(
        items=[
            m.WithItem(
                item=m.Call(func=m.Name("marked_timer"), args=[m.Arg(m.SimpleString('"old_log_prob"')), m.ZeroOrMore()])
            ),
            m.ZeroOrMore(),
        ]
    ),
    "micro_batch_loop": lambda m: m.For(
        iter=m.Name("micro_batches") | m.Call(func=m.Name("enumerate"), args=[m.Arg(m.Name("micro_batches"))])
    ),
    "legacy_loop": lambda m: m.For(target=m.Name("micro_batch"), iter=m.Name("micro_batches")),
    "select": lambda m: m.SimpleStatementLine(
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
    ),
    "assigns_losses": lambda m: m.SimpleStatementLine(
        body=[
            m.Assign(
                targets=[m.AssignTarget(m.Name("losses_reduced"))], value=m.Call(func=m.Name("forward_backward_func"))
            )
            | m.AnnAssign(target=m.Name("losses_reduced"), value=m.Call(func=m.Name("forward_backward_func")))
        ]
    ),
    "next_batch": lambda m: m.Call(func=m.Name("next"), args=[m.Arg(m.Name("batch_iter"))]),
    "self_forward_step": lambda m: m.Call(func=m.Attribute(value=m.Name("self"), attr=m.Name("forward_step"))),
    "with_forward_pass": lambda m: m.Call(func=m.Attribute(attr=m.Name("with_forward_pass"))),
    "count_forward_pass": lambda m: m.SimpleStatementLine(
        body=[m.AugAssign(target=m.Attribute(value=m.Name("self"), attr=m.Name("forward_pass_id")))]
    ),
    "return_output": lambda m: m.SimpleStatementLine(body=[m.Return(value=m.Name("output"))]),
    "returns_loss": lambda m: m.SimpleStatementLine(
        body=[
            m.Return(
                value=m.Tuple(
                    elements=[
                        m.Element(m.Name("output_tensor")),
                        m.Element(
                            m.Call(func=m.Name("partial"), args=[m.Arg(m.Name("loss_function")), m.ZeroOrMore()])
                        ),
                    ]
                )
            )
        ]
    ),
    "payload_dict": lambda m: m.SimpleStatementLine(
        body=[m.Assign(targets=[m.AssignTarget(m.Name("payload"))], value=m.Dict())]
    ),
    "env_get": lambda m: m.Call(
        func=m.Attribute(value=m.Attribute(value=m.Name("os"), attr=m.Name("environ")), attr=m.Name("get"))
        | m.Attribute(value=m.Name("self"), attr=m.Name("_rlprobe_config_path") | m.Name("_msprobe_config_path")),
        args=[m.Arg(m.SimpleString('"MSPROBE_ACTOR_CONFIG"')), m.Arg(m.SimpleString())],
    ),
    "docstring": lambda m: m.SimpleStatementLine(body=[m.Expr(m.SimpleString() | m.ConcatenatedString())]),
    "returns_anything": lambda m: m.SimpleStatementLine(body=[m.Return(value=m.DoNotCare())]),
    "part_take": lambda m: m.SimpleStatementLine(
        body=[m.Assign(targets=[m.AssignTarget(m.Name())], value=m.Attribute(value=m.Name(), attr=m.Name()))]
    ),
    "returns_tuple": lambda m: m.SimpleStatementLine(body=[m.Return(value=m.Tuple())]),
    # One rule each.
    "bare_return": lambda m: m.Return(value=None),
    "empty_call": lambda m: m.Call(args=[]),
    "one_arg_exactly": lambda m: m.Call(args=[m.DoNotCare()]),
    "two_or_more_args": lambda m: m.Call(args=[m.Arg(), m.Arg(), m.ZeroOrMore()]),
    "kw_somewhere": lambda m: m.Call(args=[m.ZeroOrMore(), m.Arg(keyword=m.Name()), m.ZeroOrMore()]),
    "only_positional": lambda m: m.Call(args=[m.ZeroOrMore(m.Arg(keyword=None))]),
    "await_call": lambda m: m.Await(m.Call()),
    "subscript": lambda m: m.Subscript(slice=[m.SubscriptElement(m.Index(m.SimpleString()))]),
    "named_class": lambda m: m.ClassDef(name=m.Name("RayPPOTrainer")),
    "named_def": lambda m: m.FunctionDef(name=m.Name("forward_backward_batch")),
}
# Our fixture trees, and one expected result of each patch (a patched file: our hooks are in it).
SOURCES = sorted(p for p in FIXTURES.rglob("*.py") if p.stat().st_size > 400) + [
    min(cases)
    for patch in sorted((FIXTURES.parent / "patches").iterdir())
    if (cases := list(patch.glob("cases/*/after.py")))
]


def nodes(tree: cst.CSTNode) -> list[cst.CSTNode]:
    found: list[cst.CSTNode] = []

    class Collect(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            found.append(node)
            return True

    tree.visit(Collect())
    return found


@pytest.fixture(scope="module")
def modules() -> dict[Path, tuple[cst.Module, list[cst.CSTNode]]]:
    assert len(SOURCES) > 10, "the fixture trees are missing"
    parsed = {p: cst.parse_module(p.read_bytes()) for p in SOURCES}
    return {p: (module, nodes(module)) for p, module in parsed.items()}


def outer_types(matcher: ours.BaseMatcherNode) -> set[str]:
    if isinstance(matcher, ours.OneOf):
        return {t for option in matcher.options for t in outer_types(option)}
    return {type(matcher).__name__}


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_same_answers_as_libcst_matchers(name: str, modules: dict[Path, tuple[cst.Module, list[cst.CSTNode]]]) -> None:
    theirs_m, ours_m = PATTERNS[name](libcst_m), PATTERNS[name](ours)
    types = outer_types(ours_m)
    hits = 0
    found_ours: set[int] = set()
    found_theirs: set[int] = set()
    for path, (module, all_nodes) in modules.items():
        for node in all_nodes:
            # A node of another class never matches (libcst.matchers compares class names first):
            # asking libcst.matchers about those too would only make the test slow.
            want = type(node).__name__ in types and libcst_m.matches(node, theirs_m)
            assert ours.matches(node, ours_m) is want, (path, name, module.code_for_node(node)[:200])
            hits += want
            if want:
                found_theirs.add(id(node))
        found_ours |= {id(n) for n in ours.findall(module, ours_m)}
    assert found_ours == found_theirs  # what libcst.matchers.findall finds: every node that matches
    if name not in ("returns_loss", "count_forward_pass", "return_output", "with_forward_pass", "payload_dict"):
        assert hits, f"{name} matches nothing in the fixtures: the comparison would prove nothing"


def test_replace_gives_libcst_matchers_code(modules: dict[Path, tuple[cst.Module, list[cst.CSTNode]]]) -> None:
    def with_default(call: cst.CSTNode, _: object) -> cst.CSTNode:
        default = cst.ensure_type(call, cst.Call).args[1]
        return call.with_deep_changes(default, value=cst.SimpleString('"/baked.json"'))

    replaced = 0
    for module, _ in [m for m in modules.values() if "MSPROBE_ACTOR_CONFIG" in m[0].code][:3]:
        # (three modules that hold the call: libcst.matchers.replace is slow)
        theirs = libcst_m.replace(module, PATTERNS["env_get"](libcst_m), with_default)
        mine = ours.replace(module, PATTERNS["env_get"](ours), with_default)
        assert isinstance(theirs, cst.Module) and isinstance(mine, cst.Module)
        assert mine.code == theirs.code
        replaced += mine.code != module.code
    assert replaced, "no fixture holds the call: the comparison would prove nothing"


def test_matches_is_false_on_sentinels_and_wrong_fields() -> None:
    assert not ours.matches(cst.MaybeSentinel.DEFAULT, ours.Name())
    with pytest.raises(TypeError):
        ours.Name(nonexistent="x")
    with pytest.raises(TypeError):
        ours.Name("a", value="b")
