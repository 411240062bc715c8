"""The trees a command acts on: the roots given, else the trees an interpreter imports, else
(for the commands over recorded trees) every tree `apply` registered."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from rlprobe_patch.base.errors import RefusedError
from rlprobe_patch.catalogue.trees import PACKAGES, TRAINERS, Tree, find_tree, importable
from rlprobe_patch.record.folder import RECORD_FOLDER_NAME
from rlprobe_patch.record.registry import registered_trees

# The inference engines a mode's set is applied to when `--python` names the environment. Where
# vLLM-Ascend is installed, its NPUModelRunner dumps with its own debugger (vllm-ascend.*), and
# community vLLM, which it runs on, is not hooked a second time.
ENGINES = ("sglang", "vllm_ascend", "vllm")
NOT_TWICE = (
    "vLLM-Ascend is installed: its NPUModelRunner dumps with its own msprobe debugger, so community vLLM "
    "(which it runs on) is not hooked a second time (pass --vllm-root to patch it anyway)"
)

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
        self.notes: list[str] = []  # what was left out of the trees found, and why

    def for_apply(self, mode: str | None, needs_verl: bool, only: tuple[str, ...] = ()) -> list[Tree]:
        """The trees named; else the trainer (when `needs_verl` or in consistency mode) and, in a
        collection mode or for `only` patches of an engine, the inference engines `python` imports."""
        if self.given:  # exactly the trees named, nothing searched
            return [find_tree(package, root) for package, root in self.given.items()]
        trees = self._trainers() if needs_verl or mode == "consistency" else []
        named = {id_.split(".")[0].replace("-", "_") for id_ in only}
        if mode in ("inference", "consistency"):
            trees += [find_tree(p, None, self.python) for p in self._engines()]
        elif named & set(ENGINES):
            trees += [find_tree(p, None, self.python) for p in self._engines() if p in named]
        if not trees:
            raise RefusedError(
                "no tree to patch: nothing importable for this mode",
                hint="name the trees with --verl-root / --sglang-root / --vllm-ascend-root / --vllm-root",
            )
        return trees

    def _engines(self) -> list[str]:
        """The inference engines `python` imports; community vLLM not where vLLM-Ascend is."""
        found = [p for p in ENGINES if importable(p, self.python)]
        if "vllm_ascend" in found and "vllm" in found:
            found.remove("vllm")
            self.notes.append(NOT_TWICE)
        return found

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
            trees = [find_tree(p, None, self.python) for p in others]
            # Community vLLM under vLLM-Ascend: only when something was applied to it (--vllm-root).
            keep = "vllm_ascend" not in others
            trees = [t for t in trees if t.package != "vllm" or keep or (t.root / RECORD_FOLDER_NAME).is_dir()]
            if trees and not any(importable(p, self.python) for p in TRAINERS):
                return trees  # an inference engine's own environment (a rollout venv without verl)
            return self._trainers() + trees
        entries = registered_trees()
        if not entries:
            raise RefusedError(
                "no patched tree is registered",
                hint="pass --verl-root DIR (or --sglang-root, --vllm-ascend-root, --vllm-root, --python PATH) "
                "to name the tree",
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
