"""What a patch's codemod declares: its operations (`Hook`, `AddMethods`, `HoistKeyword`, `AddDefinitions`), where
a hook goes (`Where`, `METHOD`, `ANY`), and what is said of a file (`State`, `StateReport`, `AnchorError`)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m

Statement = cst.BaseStatement

StatementPredicate = Callable[[Statement], bool]


class AnchorError(Exception):
    """A structural anchor is missing or ambiguous: the patch cannot be placed safely."""

    def __init__(self, scope: str, expected: str, found: str) -> None:
        self.scope = scope
        self.expected = expected
        self.found = found
        super().__init__(f"{scope}: expected {expected}; found {found}")


class State(str, enum.Enum):
    APPLIED = "applied"
    APPLICABLE = "applicable"
    DRIFTED = "drifted"


@dataclass(frozen=True)
class StateReport:
    state: State
    reasons: tuple[str, ...] = ()
    params: dict[str, str] = field(default_factory=dict)
    # The tree as this patch wants it (insert(strip(tree))); None when an anchor failed.
    expected: cst.Module | None = field(default=None, compare=False, repr=False)


class Where(str, enum.Enum):
    START = "start"  # first statements of the block (after a method's docstring)
    END = "end"  # last statements of the block
    BEFORE = "before"  # immediately before each anchor statement
    AFTER = "after"  # immediately after each anchor statement


METHOD = "method"  # the method's own body

ANY = "any"  # every block inside the method (nested functions and classes excluded)


@dataclass(frozen=True)
class Hook:
    """Insert the body of the payload function `payload` into `cls.method`.

    `block` picks the statement blocks searched: METHOD, ANY, or a predicate on the compound
    statement that owns the block (for example the `for` loop over micro-batches).
    `anchor` picks statements inside those blocks for BEFORE/AFTER.
    `template` maps names used in the payload to expressions taken from the anchor.
    `parameters` names the method's parameters the payload reads: a method without one is refused.
    """

    cls: str | None  # None: a module-level function named `method`
    method: str
    payload: str
    where: Where
    block: str | StatementPredicate = METHOD
    anchor: StatementPredicate | None = None
    expected: str = ""  # how the anchor is described to users
    many: bool = False  # the anchor may (and must at least once) match several times
    template: Callable[[Statement], dict[str, cst.BaseExpression]] | None = None
    inner: str | None = None  # the hook goes into the function of this name defined (once) inside the method
    parameters: tuple[str, ...] = ()  # parameters of the method the payload reads (refused where one is missing)


@dataclass(frozen=True)
class AddMethods:
    """Add every method of the payload class `payload_cls` (default: `cls`) to the class `cls`."""

    cls: str
    payload_cls: str | None = None


@dataclass(frozen=True)
class HoistKeyword:
    """Name the value of `keyword=` in the one call of `cls.method` that `call` matches.

    `f(keyword=EXPR)` becomes `name = EXPR` followed by `f(keyword=name)`, so that hooks after
    the call can use the value (for example the request id a rollout server was sent).
    """

    cls: str | None
    method: str
    call: m.BaseMatcherNode
    keyword: str
    name: str
    expected: str = ""


@dataclass(frozen=True)
class AddDefinitions:
    """Append the payload's module-level definitions named `names` (functions, classes, `name = ...`
    assignments) to the end of the target module, in the payload's order.

    For targets whose hooks live in module-level functions, with no class to add methods to."""

    names: tuple[str, ...]


Operation = Hook | AddMethods | HoistKeyword | AddDefinitions


def scope_name(op: Hook | HoistKeyword) -> str:
    name = f"{op.cls}.{op.method}" if op.cls else op.method
    inner = getattr(op, "inner", None)
    return f"{name}.<locals>.{inner}" if inner else name
