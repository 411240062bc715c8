"""Partial parsing (`partial.py`) gives the bytes a whole-file parse gives.

A codemod that hooks the start and the end of one method, adds a method to its class and a
function to the module is run twice on the same file: on the whole file's syntax tree, and on
the reduced text (`partial.reduce`, only that class's method parsed) with the result spliced
back. The two must write the same bytes and decide the same states, or refuse with the same
reason. Run here on generated modules whose blank and comment lines sit at every indentation
LibCST could give to a neighbour (a block's footer or the next statement's leading lines), and
on every module of real releases (verl, SGLang, vLLM-Ascend) in tests/real/test_partial_real.py;
the codemod and the comparison are in tests/partial_compare.py.
"""

from __future__ import annotations

import ast

import hypothesis.strategies as st
import libcst as cst
from hypothesis import HealthCheck, given, settings
from partial_compare import compare, probe

from rlprobe_patch.codemod import Payload, Scope, reduce

# -- generated modules: blank and comment lines at every indentation ---------------------------
INDENTS = ("", "    ", "        ", "  ")
FILLER = st.lists(st.sampled_from(["\n", "# c\n", "    # c\n", "        # c\n", "  # c\n", "    \n"]), max_size=3).map(
    "".join
)


@st.composite
def method(draw: st.DrawFn, name: str) -> str:
    decorator = draw(st.sampled_from(["", "    @staticmethod\n", "    @property\n    # between\n"]))
    body = draw(
        st.sampled_from(
            ["        x = 1\n", '        """Doc."""\n        return 1\n', "        if x:\n            y = 2\n"]
        )
    )
    args = "" if "staticmethod" in decorator else "self"
    return f"{decorator}    def {name}({args}):\n{body}{draw(FILLER)}"


@st.composite
def klass(draw: st.DrawFn, name: str) -> str:
    if draw(st.booleans()) and draw(st.booleans()):
        return f"class {name}: pass\n{draw(FILLER)}"
    names = draw(st.lists(st.sampled_from(["fit", "step", "run", "other"]), min_size=1, max_size=4))
    parts = [draw(method(n)) for n in names]
    if draw(st.booleans()):
        parts.insert(draw(st.integers(0, len(parts))), f"    a = 1; b = 2\n{draw(FILLER)}")
    return f"class {name}(Base):\n" + "".join(parts)


@st.composite
def module_text(draw: st.DrawFn) -> str:
    items = [draw(st.sampled_from(["import os\n", '"""Module."""\n', "# header\n", ""]))]
    for i in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["class", "class", "def", "if", "assign", "two spaces"]))
        if kind == "class":
            items.append(draw(klass(draw(st.sampled_from(["A", "B", "Trainer"])))))
        elif kind == "def":
            items.append(f"def fit(x):\n    return x\n{draw(FILLER)}")
        elif kind == "if":
            items.append(
                draw(
                    st.sampled_from(
                        ["if x:\n    y = 1\n", "if x: y = 1\n", "try:\n    import a\nexcept ImportError:\n    pass\n"]
                    )
                )
            )
        elif kind == "two spaces":  # a block indented otherwise: LibCST's default indentation may come from it
            items.append(
                draw(st.sampled_from(["class Z:\n  z = 1\n\n  def fit(self):\n    return 1\n", "if x:\n  y = 1\n"]))
            )
        else:
            items.append(f"v{i} = {i}\n")
        items.append(draw(FILLER))
    return "".join(items)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(module_text(), st.sampled_from(["A", "B", "Trainer", None]), st.sampled_from(["fit", "step", "run"]))
def test_partial_parse_writes_what_a_whole_parse_writes_on_generated_modules(
    probe_payload: Payload, text: str, cls: str | None, name: str
) -> None:
    try:
        ast.parse(text)
    except SyntaxError:
        return  # an indented comment before a block's first statement can make generated text invalid
    compare(probe(probe_payload, cls, name), text.encode(), cst.parse_module(text.encode()), text)


def test_files_that_do_not_fit_are_parsed_whole() -> None:
    scope = Scope(methods={"A": frozenset({"f"})})
    fits = b"import os\n\n\nclass A:\n    def f(self):\n        pass\n\n    def g(self):\n        pass\n\n\nclass B:\n"
    fits += b"    x = 1\n"
    assert reduce(fits, scope) is not None
    for data in (
        fits.replace(b"\n", b"\r\n"),  # another newline
        fits[:-1],  # no newline at the end
        b"# -*- coding: latin-1 -*-\n" + fits,  # another encoding
        fits + b"def broken(:\n",  # not Python: the whole-file parse says where
        b"if x: y = 1\n" + fits,  # LibCST's indentation would come from a block that may be left out
    ):
        assert reduce(data, scope) is None, data


def test_scopes_unite_and_cover() -> None:
    a = Scope(frozenset({"f"}), {"A": frozenset({"x"})})
    b = Scope(frozenset(), {"A": frozenset({"y"}), "B": frozenset({"z"})})
    both = a | b
    assert both.names == {"f"} and both.methods == {"A": {"x", "y"}, "B": {"z"}}
    assert both.covers(a) and both.covers(b) and not a.covers(b)
    assert Scope(frozenset({"A"})).covers(b.__class__(methods={"A": frozenset({"q"})}))  # a class read whole
