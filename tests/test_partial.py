"""Partial parsing (`partial.py`) gives the bytes a whole-file parse gives.

A codemod that hooks the start and the end of one method, adds a method to its class and a
function to the module is run twice on the same file: on the whole file's syntax tree, and on
the reduced text (`partial.reduce`, only that class's method parsed) with the result spliced
back. The two must write the same bytes and decide the same states, or refuse with the same
reason. Run on every module of real releases (verl, SGLang, vLLM-Ascend), and on generated
modules whose blank and comment lines sit at every indentation LibCST could give to a
neighbour (a block's footer or the next statement's leading lines).
"""

from __future__ import annotations

import ast
import random
import zipfile
from pathlib import Path

import hypothesis.strategies as st
import libcst as cst
import pytest
from conftest import package_wheel, verl_wheel
from hypothesis import HealthCheck, given, settings

from rlprobe_patch.catalogue.patches import load_catalogue
from rlprobe_patch.codemod import (
    AddDefinitions,
    AddMethods,
    AnchorError,
    Hook,
    PatchCodemod,
    Payload,
    Scope,
    State,
    Where,
    reduce,
)

PAYLOAD = """\
class Added:
    def _probe_added(self):
        return "probe"


def at_start():
    _probe_started = True  # rlprobe-test


def at_end():
    _probe_ended = True


def _probe_definition():
    return 3
"""


@pytest.fixture(scope="module")
def payload(tmp_path_factory: pytest.TempPathFactory) -> Payload:
    path = tmp_path_factory.mktemp("payload") / "payload.py"
    path.write_text(PAYLOAD)
    return Payload(path)


def probe(payload: Payload, cls: str | None, method: str) -> PatchCodemod:
    """A codemod hooking `cls.method` (a module-level function when `cls` is None)."""
    ops: list[object] = [
        Hook(cls, method, "at_start", Where.START, expected="the method"),
        Hook(cls, method, "at_end", Where.END, expected="the method"),
        AddDefinitions(("_probe_definition",)),
    ]
    if cls is not None:
        ops.append(AddMethods(cls, payload_cls="Added"))
    codemod_class = type("Probe", (PatchCodemod,), {"OPERATIONS": tuple(ops)})
    return codemod_class(payload, "target.py")  # type: ignore[no-any-return]


def outcome(codemod: PatchCodemod, data: bytes, whole: cst.Module | None) -> tuple[str, ...]:
    """What the codemod makes of the file: the code it writes and the states before and after.
    `whole`: the file's whole syntax tree; None: the partial parse."""
    reduced = reduce(data, codemod.scope()) if whole is None else None
    module = whole or cst.parse_module(reduced.text if reduced else data)
    before = codemod.state(module)
    try:
        patched = codemod.insert(module)
    except AnchorError as exc:
        return ("refused", str(exc), before.state.value)
    after = codemod.state(patched)
    code = reduced.splice(patched.code) if reduced else patched.code
    stripped = codemod.strip(patched).code
    return (code, before.state.value, after.state.value, (stripped == module.code and "strips back") or "")


def compare(codemod: PatchCodemod, data: bytes, whole: cst.Module, where: str) -> bool:
    """Same outcome both ways; True when the partial parse was used (not a whole-file fallback)."""
    reduced = reduce(data, codemod.scope())
    if reduced is not None:
        module = cst.parse_module(reduced.text)
        assert module.default_indent == reduced.indent, where
        # Nothing changed: the whole parse's code (LibCST's own, not always the file's: it drops a
        # blank line before an indented comment that ends a file).
        assert reduced.splice(module.code) == whole.code, where
    result = outcome(codemod, data, whole)
    assert outcome(codemod, data, None) == result, f"{where}: partial and whole parse differ"
    if result[0] != "refused":
        assert result[1:] == (State.APPLICABLE.value, State.APPLIED.value, "strips back"), where
    return reduced is not None


def cases(data: bytes, rng: random.Random) -> list[tuple[str | None, str]]:
    """(class, method) pairs to hook in a module: the first, the last and one more method of up to
    three classes, and up to two module-level functions."""
    tree = ast.parse(data)
    defs = (ast.FunctionDef, ast.AsyncFunctionDef)
    classes = [s for s in tree.body if isinstance(s, ast.ClassDef)]
    functions = [s for s in tree.body if isinstance(s, defs)]
    out: list[tuple[str | None, str]] = []
    for cls in {id(c): c for c in (classes[:1] + classes[-1:] + rng.sample(classes, min(1, len(classes))))}.values():
        methods = [s.name for s in cls.body if isinstance(s, defs)]
        out += [
            (cls.name, name)
            for name in dict.fromkeys(methods[:1] + methods[-1:] + rng.sample(methods, min(1, len(methods))))
        ]
    out += [(None, f.name) for f in rng.sample(functions, min(2, len(functions)))]
    return out


def modules_of(wheel: Path, package: str, rng: random.Random, sample: int = 40) -> list[tuple[str, bytes]]:
    """The modules of a release that the catalogue patches, and `sample` others picked at random."""
    targets = {s.target for p in load_catalogue() if p.package == package for s in p.sites}
    with zipfile.ZipFile(wheel) as zf:
        names = sorted(n for n in zf.namelist() if n.endswith(".py") and "/" in n)
        others = [n for n in names if n not in targets]
        chosen = [n for n in names if n in targets] + rng.sample(others, min(sample, len(others)))
        return [(n, zf.read(n)) for n in chosen]


@pytest.mark.real
@pytest.mark.parametrize(
    ("package", "version"),
    [("verl", "0.9.1"), ("verl", "0.7.1"), ("verl", "0.6.1"), ("sglang", "0.5.10.post1"), ("vllm-ascend", "0.13.0")],
)
def test_partial_parse_writes_what_a_whole_parse_writes_on_real_modules(
    payload: Payload, package: str, version: str
) -> None:
    wheel = verl_wheel(version) if package == "verl" else package_wheel(package, version)
    rng = random.Random(f"{package} {version}")
    compared = reduced = 0
    for name, data in modules_of(wheel, package, rng):
        whole = cst.parse_module(data)
        for cls, method in cases(data, rng):
            where = f"{package} {version} {name} {cls}.{method}"
            reduced += compare(probe(payload, cls, method), data, whole, where)
            compared += 1
    assert compared > 100  # the releases' classes and functions, not a handful
    # Most are parsed partially, so that the comparison is of that path. The others are parsed whole:
    # files with CRLF newlines or none at the end, and small ones where every statement is read.
    assert reduced > 0.75 * compared


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
    payload: Payload, text: str, cls: str | None, name: str
) -> None:
    try:
        ast.parse(text)
    except SyntaxError:
        return  # an indented comment before a block's first statement can make generated text invalid
    compare(probe(payload, cls, name), text.encode(), cst.parse_module(text.encode()), text)


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
