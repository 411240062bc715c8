"""Mutation robustness: real verl files, mutated; the tool refuses with the reason or places the
hooks exactly right. Never a wrong placement.

Each mutation edits the real file of a release (found through `ast`, so it follows the release's
layout): the engine hooks on verl 0.8.0 / 0.9.1 (10 mutations each), the consistency set's
prompts-only and request-id patches on 0.9.1 (7) and the legacy FSDP / Megatron workers on 0.7.1
(7): renamed, duplicated or dropped anchors, a relabelled timer, a keyword taken out of the
server call, reordered imports and methods. Outcomes:

- refused: exit 3, nothing written, and the reason names the file and what is missing or ambiguous;
- placed correctly: applied, our state check says APPLIED, and the hooks sit exactly where they
  sit on the unmutated release: mutating the patched original gives the same bytes as patching
  the mutated file (the mutation and the patch commute);
- anything else is a wrong placement, and the test allows none.
"""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import cli_json, snapshot

from rlprobe_patch.base.errors import ExitCode

FSDP = "verl/workers/engine/fsdp/transformer_impl.py"
MEGATRON = "verl/workers/engine/megatron/transformer_impl.py"


def method(text: str, cls: str, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    tree = ast.parse(text)
    (found,) = [
        f
        for c in tree.body
        if isinstance(c, ast.ClassDef) and c.name == cls
        for f in c.body
        if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef) and f.name == name
    ]
    return found


def lines_of(text: str, node: ast.stmt) -> tuple[int, int]:
    assert node.end_lineno is not None
    return node.lineno - 1, node.end_lineno  # slice of text.splitlines(keepends=True)


def rename_method(cls: str, name: str) -> Callable[[str], str]:
    def mutate(text: str) -> str:
        lines = text.splitlines(keepends=True)
        i = method(text, cls, name).lineno - 1
        lines[i] = lines[i].replace(f"def {name}(", f"def {name}_renamed(", 1)
        return "".join(lines)

    return mutate


def rename_class(cls: str) -> Callable[[str], str]:
    return lambda text: text.replace(f"class {cls}(", f"class {cls}Renamed(", 1)


def micro_batch_loop(text: str) -> ast.For:
    fn = method(text, "FSDPEngine", "forward_backward_batch")
    (loop,) = [s for s in fn.body if isinstance(s, ast.For)]
    return loop


def duplicate_loop(text: str) -> str:
    lines = text.splitlines(keepends=True)
    start, end = lines_of(text, micro_batch_loop(text))
    return "".join(lines[:end] + lines[start:end] + lines[end:])


def first_statement_index(body: list[ast.stmt], test: Callable[[ast.stmt], bool]) -> int:
    return next(i for i, s in enumerate(body) if test(s))


def swap_before_loop(text: str) -> str:
    """Swap `output_lst = []` and the `ctx = ...` line after it: neutral for the hooks."""
    fn = method(text, "FSDPEngine", "forward_backward_batch")
    i = first_statement_index(fn.body, lambda s: ast.unparse(s) == "output_lst = []")
    a, b = fn.body[i], fn.body[i + 1]
    assert ast.unparse(b).startswith("ctx = ")
    lines = text.splitlines(keepends=True)
    (a0, a1), (b0, b1) = lines_of(text, a), lines_of(text, b)
    return "".join(lines[:a0] + lines[b0:b1] + lines[a1:b0] + lines[a0:a1] + lines[b1:])


def next_batch(text: str) -> ast.stmt:
    fn = method(text, "MegatronEngineWithLMHead", "forward_step")
    return fn.body[first_statement_index(fn.body, lambda s: "next(batch_iter)" in ast.unparse(s))]


def drop_next_batch(text: str) -> str:
    lines = text.splitlines(keepends=True)
    start, end = lines_of(text, next_batch(text))
    return "".join(lines[:start] + lines[end:])


def duplicate_next_batch(text: str) -> str:
    lines = text.splitlines(keepends=True)
    start, end = lines_of(text, next_batch(text))
    return "".join(lines[:end] + lines[start:end] + lines[end:])


def swap_imports(text: str) -> str:
    """Swap the first two top-level import statements: neutral for the hooks."""
    tree = ast.parse(text)
    imports = [s for s in tree.body if isinstance(s, ast.Import | ast.ImportFrom)]
    a, b = imports[0], imports[1]
    lines = text.splitlines(keepends=True)
    (a0, a1), (b0, b1) = lines_of(text, a), lines_of(text, b)
    assert a1 == b0
    return "".join(lines[:a0] + lines[b0:b1] + lines[a0:a1] + lines[b1:])


def reorder_methods(cls: str, first: str, second: str) -> Callable[[str], str]:
    """Move method `second` above method `first` in class `cls`: neutral for the hooks."""

    def mutate(text: str) -> str:
        lines = text.splitlines(keepends=True)
        f, s = method(text, cls, first), method(text, cls, second)
        f0 = min([f.lineno, *(d.lineno for d in f.decorator_list)]) - 1
        s0 = min([s.lineno, *(d.lineno for d in s.decorator_list)]) - 1
        assert s.end_lineno is not None and f0 < s0
        return "".join(lines[:f0] + lines[s0 : s.end_lineno] + ["\n"] + lines[f0:s0] + lines[s.end_lineno :])

    return mutate


FSDP_PATCH = ("verl.fsdp-engine", "fsdp", FSDP)
MEGATRON_PATCH = ("verl.megatron-engine", "megatron", MEGATRON)
# (name, (patch, backend, file), mutation, neutral): a neutral mutation leaves every anchor intact.
MUTATIONS = [
    ("rename forward_backward_batch", FSDP_PATCH, rename_method("FSDPEngine", "forward_backward_batch"), False),
    ("rename class FSDPEngine", FSDP_PATCH, rename_class("FSDPEngine"), False),
    ("duplicate the micro-batch loop", FSDP_PATCH, duplicate_loop, False),
    ("swap statements before the loop", FSDP_PATCH, swap_before_loop, True),
    ("swap the first imports (fsdp)", FSDP_PATCH, swap_imports, True),
    ("drop next(batch_iter)", MEGATRON_PATCH, drop_next_batch, False),
    ("duplicate next(batch_iter)", MEGATRON_PATCH, duplicate_next_batch, False),
    ("rename forward_step", MEGATRON_PATCH, rename_method("MegatronEngineWithLMHead", "forward_step"), False),
    ("rename class MegatronEngineWithLMHead", MEGATRON_PATCH, rename_class("MegatronEngineWithLMHead"), False),
    ("swap the first imports (megatron)", MEGATRON_PATCH, swap_imports, True),
]


def outcome(root: Path, patch: str, backend: str, target: str, mutate, patched_original: str) -> str:
    path = root / target
    path.write_text(mutate(path.read_text()))
    before = snapshot(root)
    code, out = cli_json("apply", "--verl-root", root, "--backend", backend, "--only", patch)
    if code == ExitCode.REFUSED:
        assert snapshot(root) == before and not (root / ".rlprobe-patch").exists()
        reasons = " ".join(out["details"])
        assert target in reasons or "FSDPEngine" in reasons or "Megatron" in reasons, out
        return "refused"
    assert code == ExitCode.OK, out
    code, status = cli_json("status", "--verl-root", root, "--backend", backend)
    state = {p["id"]: p["state"] for p in status["trees"][0]["patches"]}[patch]
    if state == "applied" and path.read_text() == mutate(patched_original):
        return "placed correctly"
    return "WRONG PLACEMENT"


@pytest.mark.parametrize("version", ["0.8.0", "0.9.1"])
def test_mutated_engines(real_tree, version: str) -> None:
    reference = real_tree(version)
    reference = reference.rename(reference.parent / "reference")  # real_tree unpacks into the same folder
    patched = {}
    for backend, target in (("fsdp", FSDP), ("megatron", MEGATRON)):
        code, _ = cli_json("apply", "--verl-root", reference, "--backend", backend, "--worker-impl", "engine")
        assert code == ExitCode.OK
        patched[target] = (reference / target).read_text()
    outcomes: Counter[str] = Counter()
    seen = {}
    for i, (name, (patch, backend, target), mutate, _) in enumerate(MUTATIONS):
        root = real_tree(version).rename(reference.parent / f"m{i}")  # a fresh copy per mutation
        result = outcome(root, patch, backend, target, mutate, patched[target])
        seen[name] = result
        outcomes[result] += 1
    assert outcomes == {"refused": 7, "placed correctly": 3}, seen  # zero wrong placements
    assert seen == {name: "placed correctly" if neutral else "refused" for name, _, _, neutral in MUTATIONS}


# -- the consistency set and the legacy workers ------------------------------------------------
RAY_TRAINER = "verl/trainer/ppo/ray_trainer.py"
LLM_SERVER = "verl/workers/rollout/llm_server.py"
DP_ACTOR = "verl/workers/actor/dp_actor.py"
MEGATRON_ACTOR = "verl/workers/actor/megatron_actor.py"


Scope = tuple[str, str] | None  # (class, method) to search in, or the whole file


def statement(text: str, test: Callable[[ast.stmt], bool], scope: Scope) -> ast.stmt:
    """The one statement (at any depth of the file, or of the method `scope`) that `test` picks."""
    top = method(text, *scope) if scope else ast.parse(text)
    (found,) = [node for node in ast.walk(top) if isinstance(node, ast.stmt) and test(node)]
    return found


def duplicate(test: Callable[[ast.stmt], bool], scope: Scope = None) -> Callable[[str], str]:
    def mutate(text: str) -> str:
        lines = text.splitlines(keepends=True)
        start, end = lines_of(text, statement(text, test, scope))
        return "".join(lines[:end] + lines[start:end] + lines[end:])

    return mutate


def drop(test: Callable[[ast.stmt], bool], scope: Scope = None) -> Callable[[str], str]:
    def mutate(text: str) -> str:
        lines = text.splitlines(keepends=True)
        start, end = lines_of(text, statement(text, test, scope))
        return "".join(lines[:start] + lines[end:])

    return mutate


def replace_once(old: str, new: str) -> Callable[[str], str]:
    def mutate(text: str) -> str:
        assert text.count(old) == 1, old
        return text.replace(old, new)

    return mutate


def old_log_prob_timer(node: ast.stmt) -> bool:
    return isinstance(node, ast.With) and "'old_log_prob'" in ast.unparse(node.items[0])


def server_call(node: ast.stmt) -> bool:
    return isinstance(node, ast.Assign | ast.AnnAssign) and "generate.remote(" in ast.unparse(node)


def log_prob_loop(node: ast.stmt) -> bool:
    return isinstance(node, ast.For) and ast.unparse(node.target) == "micro_batch"


def next_batch_stmt(node: ast.stmt) -> bool:
    return isinstance(node, ast.Assign) and ast.unparse(node) == "batch = next(batch_iter)"


PROMPTS = ("verl.prompts-only", RAY_TRAINER)
REQUEST_ID = ("verl.request-id", LLM_SERVER)
LEGACY_FSDP = ("verl.legacy-fsdp-workers", DP_ACTOR)
LEGACY_MEGATRON = ("verl.legacy-megatron-workers", MEGATRON_ACTOR)
# (release, name, (patch, file), mutation, neutral)
MORE_MUTATIONS = [
    ("0.9.1", "duplicate the old_log_prob timer block", PROMPTS, duplicate(old_log_prob_timer), False),
    (
        "0.9.1",
        "relabel the old_log_prob timer",
        PROMPTS,
        replace_once('marked_timer("old_log_prob"', 'marked_timer("olp"'),
        False,
    ),
    ("0.9.1", "swap the first imports (ray_trainer)", PROMPTS, swap_imports, True),
    ("0.9.1", "duplicate the server call", REQUEST_ID, duplicate(server_call), False),
    (
        "0.9.1",
        "drop request_id= from the server call",
        REQUEST_ID,
        replace_once("request_id=self._vllm_request_id(request_id),", ""),
        False,
    ),
    ("0.9.1", "rename LLMServerClient.generate", REQUEST_ID, rename_method("LLMServerClient", "generate"), False),
    ("0.9.1", "swap the first imports (llm_server)", REQUEST_ID, swap_imports, True),
    (
        "0.7.1",
        "duplicate the log-prob micro-batch loop",
        LEGACY_FSDP,
        duplicate(log_prob_loop, ("DataParallelPPOActor", "compute_log_prob")),
        False,
    ),
    (
        "0.7.1",
        "rename compute_log_prob (dp_actor)",
        LEGACY_FSDP,
        rename_method("DataParallelPPOActor", "compute_log_prob"),
        False,
    ),
    ("0.7.1", "swap the first imports (dp_actor)", LEGACY_FSDP, swap_imports, True),
    ("0.7.1", "drop next(batch_iter) in forward_step", LEGACY_MEGATRON, drop(next_batch_stmt), False),
    ("0.7.1", "duplicate next(batch_iter) in forward_step", LEGACY_MEGATRON, duplicate(next_batch_stmt), False),
    (
        "0.7.1",
        "rename the nested forward_step",
        LEGACY_MEGATRON,
        replace_once("def forward_step(", "def fwd_step("),
        False,
    ),
    ("0.7.1", "swap the first imports (megatron_actor)", LEGACY_MEGATRON, swap_imports, True),
]


@pytest.mark.parametrize("version", ["0.7.1", "0.9.1"])
def test_mutated_consistency_and_legacy_patches(real_tree, version: str) -> None:
    cases = [c for c in MORE_MUTATIONS if c[0] == version]
    unpacked = real_tree(version)
    reference = unpacked.rename(unpacked.parent / "reference")
    patched = {}
    for patch, target in {c[2] for c in cases}:
        code, out = cli_json("apply", "--verl-root", reference, "--backend", backend_of(patch), "--only", patch)
        assert code == ExitCode.OK, out
        patched[target] = (reference / target).read_text()
    seen = {}
    for i, (_, name, (patch, target), mutate, _) in enumerate(cases):
        root = real_tree(version).rename(reference.parent / f"m{i}")
        seen[name] = outcome(root, patch, backend_of(patch), target, mutate, patched[target])
    assert "WRONG PLACEMENT" not in seen.values(), seen
    assert seen == {name: "placed correctly" if neutral else "refused" for _, name, _, _, neutral in cases}


def backend_of(patch: str) -> str:
    return "megatron" if "megatron" in patch else "fsdp"
