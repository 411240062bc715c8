"""Status: every catalogue patch of a tree's package and its state, the live and superseded records."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from rlprobe_patch.catalogue import load_catalogue
from rlprobe_patch.plan import PatchPlan, Selection, plan_apply
from rlprobe_patch.records import Superseded, sort_records
from rlprobe_patch.rules import hooked_worker_paths
from rlprobe_patch.state import Record, StateDir
from rlprobe_patch.transaction import recover, write_phase
from rlprobe_patch.trees import Tree


@dataclass
class StatusResult:
    tree: Tree
    patches: list[PatchPlan]
    records: list[Record]  # the live records
    recovered: list[str]
    pending_journal: bool
    worker_paths: list[str] = field(default_factory=list)  # worker paths whose hooks are applied
    superseded: list[Superseded] = field(default_factory=list)


def status(tree: Tree, backend: str | None = None, trust_record: bool = False) -> StatusResult:
    """Every catalogue patch of the tree's package (or of one backend) and its state."""
    state = StateDir(tree.root, trust_record)
    recovered: list[str] = []
    if state.read_journal() is not None and os.access(state.path, os.W_OK):
        with state.lock(10.0), write_phase(state, f"finishing an interrupted write in {tree.root}"):
            recovered = recover(state)
    records = sort_records(tree, state.read_ledger())
    ids = tuple(p.id for p in load_catalogue() if p.package == tree.package and (backend is None or p.serves(backend)))
    selection = Selection(backend or "any", only=ids, refuse_off_range=False)
    plan = plan_apply(tree, selection, {}, check=False, upgrade=False, state=state)
    return StatusResult(
        tree,
        plan.patches,
        records.live,
        recovered,
        state.read_journal() is not None,
        hooked_worker_paths(records.live),
        records.superseded,
    )
