"""The codemod toolkit every patch in `patches/` is written with: its one public import path.

A patch's `codemod.py` imports from here only (`from rlprobe_patch.codemod import Hook, ...`);
so does the engine. The modules behind it are private:

- `_operations`: the declaration's vocabulary (operations anchored on syntax: `Hook`, `AddMethods`,
  `AddDefinitions`, `HoistKeyword`; `Where`; `State`: applied / applicable / drifted, `AnchorError`);
- `_toolkit`: `PatchCodemod` (and `ConfigPathParam`, `CreateFile`), a payload file plus operations, and what is
  derived from that one declaration: `insert`, `strip` and `state`;
- `_payload`: the payload file loaded (`Payload`); `_syntax`: trees compared by their Python AST (`same_syntax`)
  and the small shapes the operations build; `_blocks`: the blocks of a method an operation edits, a hook's places;
- `_anchors`: finding nodes and the anchor helpers (`self_call`, `assigns_call`, `returns_tuple`, `findall`,
  `contains`);
- `_payload_parts`: shared payload parts, the methods written once in `patches/_shared/` and
  spliced into each payload that takes them (`assemble`);
- `_partial_parse`: parsing only what a codemod reads (`Scope`, `reduce`, `Partial`).

`catalogue.patches.Patch.fingerprint` hashes every module of this package: a change here
clears the memo of files found patched (`checked.json`).
"""

from rlprobe_patch.codemod._anchors import assigns_call, contains, findall, first_returned, returns_tuple, self_call
from rlprobe_patch.codemod._operations import (
    ANY,
    METHOD,
    AddDefinitions,
    AddMethods,
    AnchorError,
    HoistKeyword,
    Hook,
    State,
    Statement,
    StatementPredicate,
    StateReport,
    Where,
)
from rlprobe_patch.codemod._partial_parse import Partial, Scope, reduce
from rlprobe_patch.codemod._payload import Payload
from rlprobe_patch.codemod._payload_parts import PartError, assemble
from rlprobe_patch.codemod._syntax import same_syntax
from rlprobe_patch.codemod._toolkit import ConfigPathParam, CreateFile, PatchCodemod

__all__ = [
    "ANY",
    "METHOD",
    "AddDefinitions",
    "AddMethods",
    "AnchorError",
    "ConfigPathParam",
    "CreateFile",
    "HoistKeyword",
    "Hook",
    "PartError",
    "Partial",
    "PatchCodemod",
    "Payload",
    "Scope",
    "State",
    "StateReport",
    "Statement",
    "StatementPredicate",
    "Where",
    "assemble",
    "assigns_call",
    "contains",
    "findall",
    "first_returned",
    "reduce",
    "returns_tuple",
    "same_syntax",
    "self_call",
]
