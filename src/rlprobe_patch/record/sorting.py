"""The records of one tree sorted out: live, superseded by an upstream upgrade, or of an older revision.

- **live**: what the tree holds was written by the record (or edited after it): verify checks it,
  revert undoes it.
- **superseded**: the package was replaced by another release after apply (`pip install -U`):
  the tree's version differs from the record's, and no file the record patched still holds
  the record's bytes. The record describes files that are gone; it is reported, never
  reverted, and the next write drops it from the ledger without touching a file.
- **outdated**: a live record holds a patch at an older revision than the catalogue's; `apply`
  upgrades it (the record reversed and the current revision applied, in one transaction).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rlprobe_patch.base.errors import PatchError
from rlprobe_patch.base.fsio import digest, read_or_none
from rlprobe_patch.catalogue.patches import load_catalogue
from rlprobe_patch.catalogue.trees import Tree, find_tree
from rlprobe_patch.record.folder import Ledger, Record


@dataclass(frozen=True)
class Superseded:
    record: Record
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"id": self.record.id, "version": self.record.version, "reason": self.reason}


@dataclass(frozen=True)
class Outdated:
    """A patch a live record applied at an older revision than the catalogue's."""

    patch_id: str
    recorded: int
    current: int
    record: str  # the record's id

    @property
    def text(self) -> str:
        return f"applied r{self.recorded}, current r{self.current}"


@dataclass
class TreeRecords:
    """The records of one package of a tree."""

    live: list[Record] = field(default_factory=list)
    superseded: list[Superseded] = field(default_factory=list)

    @property
    def outdated(self) -> dict[str, Outdated]:
        current = {p.id: p.revision for p in load_catalogue()}
        found: dict[str, Outdated] = {}
        for record in self.live:
            for ref in record.patches:
                if ref.id in current and ref.revision < current[ref.id]:
                    found[ref.id] = Outdated(ref.id, ref.revision, current[ref.id], record.id)
        return found

    def to_upgrade(self) -> list[Record]:
        """The live records an upgrade reverses: those holding an outdated patch, and the later
        records that touch the same files (they were applied on top of them), oldest first."""
        outdated = {o.record for o in self.outdated.values()}
        chosen: list[Record] = []
        paths: set[str] = set()
        for record in self.live:  # oldest first: a later record on a chosen file is chosen too
            if record.id in outdated or record.paths & paths:
                chosen.append(record)
                paths |= record.paths
        return chosen


def superseded_reason(tree: Tree, record: Record) -> str:
    """Why `record` no longer describes the tree ("" when it does): another release replaced its files."""
    if record.version == str(tree.version):
        return ""
    modified = [f for f in record.files if f.before]  # files the patch added are left by an upgrade
    if not modified or any(digest(read_or_none(tree.root / f.path)) == f.after for f in modified):
        return ""
    return (
        f"made on {record.package} {record.version}; the tree is now {tree.package} {tree.version} and the "
        "files it patched were replaced (an upgrade of the package)"
    )


def sort_records(tree: Tree, ledger: Ledger) -> TreeRecords:
    result = TreeRecords()
    for record in ledger.records:
        if record.package != tree.package:
            continue
        reason = superseded_reason(tree, record)
        if reason:
            result.superseded.append(Superseded(record, reason))
        else:
            result.live.append(record)
    return result


def superseded_at(root: Path, ledger: Ledger, tree: Tree | None) -> list[Superseded]:
    """The records at `root` whose package was replaced by another release since apply."""
    trees: dict[str, Tree | None] = {}
    found = []
    for record in ledger.records:
        if record.package not in trees:
            if tree is not None and tree.package == record.package and tree.root == root:
                trees[record.package] = tree
            else:
                try:
                    trees[record.package] = find_tree(record.package, root)
                except PatchError:
                    trees[record.package] = None  # gone: its files are reported as deleted
        here = trees[record.package]
        reason = superseded_reason(here, record) if here is not None else ""
        if reason:
            found.append(Superseded(record, reason))
    return found
