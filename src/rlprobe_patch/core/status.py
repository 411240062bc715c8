"""Status: every catalogue patch of a tree's package and its state, the live and superseded records."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from rlprobe_patch.catalogue.patches import load_catalogue
from rlprobe_patch.catalogue.trees import Tree
from rlprobe_patch.core.plan import PatchPlan, plan_apply
from rlprobe_patch.core.rules import hooked_worker_paths
from rlprobe_patch.core.selection import Selection
from rlprobe_patch.record.folder import Record, RecordFolder
from rlprobe_patch.record.sorting import Superseded, sort_records
from rlprobe_patch.record.transaction import recover, write_phase


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
    folder = RecordFolder(tree.root, trust_record)
    recovered: list[str] = []
    if folder.read_journal() is not None and os.access(folder.path, os.W_OK):
        with folder.lock(10.0), write_phase(folder, f"finishing an interrupted write in {tree.root}"):
            recovered = recover(folder)
    records = sort_records(tree, folder.read_ledger())
    ids = tuple(p.id for p in load_catalogue() if p.package == tree.package and (backend is None or p.serves(backend)))
    selection = Selection(backend or "any", only=ids, refuse_off_range=False)
    plan = plan_apply(tree, selection, {}, check=False, upgrade=False, folder=folder)
    return StatusResult(
        tree,
        plan.patches,
        records.live,
        recovered,
        folder.read_journal() is not None,
        hooked_worker_paths(records.live),
        records.superseded,
    )
