"""Partial parsing (`partial.py`) gives the bytes a whole-file parse gives, on every module of real
releases (verl, SGLang, vLLM-Ascend): the codemod and the comparison are in tests/partial_compare.py,
generated modules in tests/unit/test_partial.py.
"""

from __future__ import annotations

import ast
import random
import zipfile
from pathlib import Path

import libcst as cst
import pytest
from conftest import package_wheel, verl_wheel
from partial_compare import compare, probe

from rlprobe_patch.catalogue.patches import load_catalogue
from rlprobe_patch.codemod import Payload

# The exhaustive leg's (`-m exhaustive`, .ci/run): too long for the README's test command (issue 35).
pytestmark = pytest.mark.exhaustive


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


@pytest.mark.parametrize(
    ("package", "version"),
    [("verl", "0.9.1"), ("verl", "0.7.1"), ("verl", "0.6.1"), ("sglang", "0.5.10.post1"), ("vllm-ascend", "0.13.0")],
)
def test_partial_parse_writes_what_a_whole_parse_writes_on_real_modules(
    probe_payload: Payload, package: str, version: str
) -> None:
    wheel = verl_wheel(version) if package == "verl" else package_wheel(package, version)
    rng = random.Random(f"{package} {version}")
    compared = reduced = 0
    for name, data in modules_of(wheel, package, rng):
        whole = cst.parse_module(data)
        for cls, method in cases(data, rng):
            where = f"{package} {version} {name} {cls}.{method}"
            reduced += compare(probe(probe_payload, cls, method), data, whole, where)
            compared += 1
    assert compared > 100  # the releases' classes and functions, not a handful
    # Most are parsed partially, so that the comparison is of that path. The others are parsed whole:
    # files with CRLF newlines or none at the end, and small ones where every statement is read.
    assert reduced > 0.75 * compared
