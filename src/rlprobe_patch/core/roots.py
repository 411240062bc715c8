"""The trees a command acts on: the roots given, else the trees an interpreter imports, else
(for the commands over recorded trees) every tree `apply` registered."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from rlprobe_patch.catalogue.trees import PACKAGES, TRAINERS, Tree, find_tree, importable
from rlprobe_patch.errors import RefusedError
from rlprobe_patch.record.registry import registered_trees

GONE_HINT = (
    "a registered tree moved or was deleted: name it with --verl-root (or the package's root option); "
    "`rlprobe-patch forget PATH` or `rlprobe-patch status --prune` drops it from the registry"
)


class Roots:
    """The trees a command acts on: `given` ({package: root}), else the trees `python` imports.

    `trust_record`: the record of a tree another user owns is used too (`--trust-record`)."""

    def __init__(self, given: Mapping[str, Path], python: str | None = None, trust_record: bool = False) -> None:
        self.given = dict(given)
        self.python = python
        self.trust_record = trust_record
        self.gone: list[dict[str, str]] = []  # registered trees that no longer exist: root, package, reason

    def for_apply(self, mode: str | None, needs_verl: bool) -> list[Tree]:
        if self.given:  # exactly the trees named, nothing searched
            return [find_tree(package, root) for package, root in self.given.items()]
        trees = self._trainers() if needs_verl or mode == "consistency" else []
        if mode in ("inference", "consistency"):
            trees += [find_tree(p, None, self.python) for p in ("sglang", "vllm_ascend") if importable(p, self.python)]
        if not trees:
            raise RefusedError(
                "no tree to patch: nothing importable for this mode",
                hint="name the trees with --verl-root / --sglang-root / --vllm-ascend-root",
            )
        return trees

    def _trainers(self) -> list[Tree]:
        """The RL frameworks `python` imports (verl, slime); verl's refusal when it imports none."""
        found = [find_tree(p, None, self.python) for p in TRAINERS if p != "verl" and importable(p, self.python)]
        if not found or importable("verl", self.python):
            found.insert(0, find_tree("verl", None, self.python))
        return found

    def for_records(self, all_gone_ok: bool = False) -> list[Tree]:
        """Trees named, or found through --python, or else every tree apply registered that still
        exists; registered trees that are gone are kept in `self.gone` (refused when all are gone)."""
        if self.given:
            return [find_tree(package, root) for package, root in self.given.items()]
        if self.python is not None:
            others = [p for p in PACKAGES if p not in TRAINERS and importable(p, self.python)]
            return self._trainers() + [find_tree(p, None, self.python) for p in others]
        entries = registered_trees()
        if not entries:
            raise RefusedError(
                "no patched tree is registered",
                hint="pass --verl-root DIR (or --sglang-root, --vllm-ascend-root, --python PATH) to name the tree",
            )
        found = []
        for entry in entries:
            try:
                found.append(find_tree(entry["package"], Path(entry["root"])))
            except RefusedError as exc:
                self.gone.append({**entry, "reason": exc.message})
        if not found and not all_gone_ok:
            raise RefusedError(
                f"every registered tree is gone: {'; '.join(g['reason'] for g in self.gone)}",
                hint=GONE_HINT,
            )
        return found
