"""What the user asked for, per tree: a backend, optionally a mode's patch set, narrowed by
--only / --skip; and which of the trees a command names each selection is for."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlprobe_patch.base.errors import RefusedError, UsageError
from rlprobe_patch.catalogue.patches import Patch, load_catalogue, select
from rlprobe_patch.catalogue.releases import releases
from rlprobe_patch.catalogue.trees import BACKENDS, TRAINERS, Tree
from rlprobe_patch.core.rules import RunFacts, resolve_worker_impl


@dataclass(frozen=True)
class Selection:
    """What the user asked for: a backend, optionally a mode's patch set, narrowed by --only/--skip."""

    backend: str
    mode: str | None = None
    only: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    refuse_off_range: bool | None = None  # default: refuse when patches were named one by one
    worker_impl: str = "engine"  # the worker path to hook: "engine" or "legacy" (see rules.resolve_worker_impl)
    facts: dict[str, Any] | None = None  # the run's values, when `--script` was read (rules notices out)

    def patches(self, package: str) -> list[Patch]:
        known = {p.id: p for p in load_catalogue()}
        unknown = [i for i in (*self.only, *self.skip) if i not in known]
        if unknown:
            raise RefusedError(f"unknown patch id: {', '.join(unknown)}", hint="`rlprobe-patch list` shows them")
        if self.only:
            chosen = [known[i] for i in self.only]
        elif self.mode is None and all("any" in p.backends for p in known.values() if p.package == package):
            chosen = [p for p in known.values() if p.package == package]  # no backend hooks (inference): its patches
        else:
            chosen = select(package, self.backend, self.mode, self.worker_impl)
        chosen = [p for p in chosen if p.id not in self.skip and p.package == package]
        if not chosen:
            raise RefusedError(
                f"no {package} patch selected for backend {self.backend!r}"
                + (f" in mode {self.mode!r}" if self.mode else ""),
                hint=f"backends: {', '.join(BACKENDS)}; `rlprobe-patch list` shows the patches",
            )
        return chosen

    @property
    def explicit(self) -> bool:
        """Patches named one by one (or the bare engine hook) are refused, not skipped, off-range."""
        if self.refuse_off_range is not None:
            return self.refuse_off_range
        return bool(self.only) or self.mode is None


@dataclass(frozen=True)
class TreeSelection:
    """What `apply` does to one tree: its selection, and (verl) the worker path hooked and why."""

    tree: Tree
    selection: Selection
    worker_path: dict[str, str] | None = None  # {"impl": "engine" | "legacy", "why": ...}


def wants_trainer(mode: str | None, only: tuple[str, ...]) -> bool:
    """Whether an apply needs the training framework's tree (verl, slime) when none is named."""
    return (mode is None and not only) or any(i.split(".")[0] in TRAINERS for i in only)


def select_trees(
    trees: list[Tree],
    *,
    backend: str | None,
    mode: str | None,
    only: tuple[str, ...] = (),
    skip: tuple[str, ...] = (),
    worker_impl: str = "auto",
    script: Path | None = None,
    read_facts: Callable[[Tree], RunFacts] | None = None,
) -> list[TreeSelection]:
    """The selection of each tree an apply acts on (a tree that --only names no patch of is left out).

    verl needs `backend`; its worker path comes from `worker_impl`, or for `auto` from the
    release data and the run's facts (`read_facts(tree)`, when a script was given). A framework
    with one hooked backend (slime: Megatron) takes its release data's default backend."""
    chosen = []
    for tree in trees:
        ids = tuple(i for i in only if i.split(".")[0] == tree.package.replace("_", "-"))
        if only and not ids:
            continue  # --only names no patch of this tree
        impl, worker_path, facts = "engine", None, None
        if tree.package == "verl":
            if backend is None:
                raise UsageError("--backend is required to patch verl (fsdp, fsdp2 or megatron)")
            run = read_facts(tree) if read_facts is not None and script is not None else None
            impl, why = resolve_worker_impl(tree, worker_impl, script, run)
            worker_path = {"impl": impl, "why": why}
            facts = {k: v for k, (v, _) in run.items()} if run else None
        selection = Selection(
            backend or releases(tree.package).default_backend or "any", mode, ids, skip, worker_impl=impl, facts=facts
        )
        chosen.append(TreeSelection(tree, selection, worker_path))
    if not chosen:
        raise RefusedError("no patch selected for the trees given", hint="`rlprobe-patch list` shows the patches")
    return chosen
