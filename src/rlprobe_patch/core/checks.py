"""One check's outcome, as verify prints it: PASS, FAIL, or WARN (passes, but read it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""
    warning: bool = False  # passes, but the user must read it

    def to_json(self) -> dict[str, Any]:
        return {"check": self.name, "ok": self.ok, "detail": self.detail, "warning": self.warning}
