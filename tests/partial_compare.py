"""Partial against whole parsing: the probe codemod and the comparison that
tests/unit/test_partial.py (generated modules) and tests/real/test_partial_real.py (real
releases' modules) run on each file.
"""

from __future__ import annotations

from pathlib import Path

import libcst as cst

from rlprobe_patch.codemod import (
    AddDefinitions,
    AddMethods,
    AnchorError,
    Hook,
    PatchCodemod,
    Payload,
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


def payload_at(folder: Path) -> Payload:
    """The probe's payload, written into `folder` (the `probe_payload` fixture of conftest.py)."""
    path = folder / "payload.py"
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
