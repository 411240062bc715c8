"""One check's outcome, as verify prints it: PASS, FAIL, or WARN (passes, but read it)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class Check:
    check: str  # what was checked
    ok: bool
    detail: str = ""
    warning: bool = False  # passes, but the user must read it

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
