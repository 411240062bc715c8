"""Apply: a plan (`plan.py`) written as one journaled transaction (`record.transaction`), one new record;
`apply_many`: every tree a command names or finds, all or nothing.

An upgrade (a patch recorded at an older revision) is the same transaction: the files go from
what the tree holds to the current revision's content, the new record keeps the original
content as its "before" (so revert restores it), and the records it replaces leave the ledger.
Records superseded by an upgrade of the package leave the ledger too, their files untouched.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlprobe_patch import __version__
from rlprobe_patch.base.diffs import diffstat, provenance_header
from rlprobe_patch.base.fsio import digest
from rlprobe_patch.catalogue.trees import ROOT_OPTIONS, Tree
from rlprobe_patch.codemod import State
from rlprobe_patch.core.plan import Plan, plan_apply, raise_if_refused, show_params
from rlprobe_patch.core.roots import Roots
from rlprobe_patch.core.rules import RunFacts
from rlprobe_patch.core.selection import Selection, select_trees, wants_trainer
from rlprobe_patch.record.folder import (
    RECORD_FOLDER_NAME,
    FileRecord,
    Journal,
    JournalFile,
    PatchRef,
    Record,
    RecordFolder,
)
from rlprobe_patch.record.transaction import recover, run_journal, write_phase

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


@dataclass
class ApplyResult:
    plan: Plan
    record: Record | None
    recovered: list[str]
    dry_run: bool
    diff: str

    @property
    def already_applied(self) -> bool:
        return not self.plan.needs_write

    @property
    def diffstat(self) -> list[tuple[str, int, int]]:
        """(path, lines added, lines removed) of each file the recorded diff changes."""
        return diffstat(self.diff)


@dataclass(frozen=True)
class ApplyRequest:
    """What `apply` is asked, for every tree: the selection (`select_trees`), the values baked into the hooks
    (`params`), and how to write."""

    backend: str | None = None
    mode: str | None = None
    only: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    worker_impl: str = "auto"
    script: Path | None = None  # the launch script whose facts decide verl's worker path (`read_facts`)
    params: dict[str, str] = field(default_factory=dict)  # msprobe_config, sglang_config
    force: bool = False
    dry_run: bool = False
    merge: bool = False
    lock_timeout: float = 10.0


@dataclass
class TreeApplied:
    """One tree's apply: its result, and (verl) the worker path hooked and why."""

    tree: Tree
    result: ApplyResult
    worker_path: dict[str, str] | None

    @property
    def status(self) -> str:
        if self.result.dry_run:
            return "dry-run"
        return "already applied" if self.result.already_applied else "applied"

    @property
    def diff_file(self) -> Path | None:
        record = self.result.record
        return self.tree.root / RECORD_FOLDER_NAME / record.diff if record else None

    def to_json(self, request: ApplyRequest) -> dict[str, Any]:
        plan, record = self.result.plan, self.result.record
        return {
            "status": self.status,
            "tree": self.tree.to_json(),
            "backend": request.backend,
            "mode": request.mode,
            "patches": [p.to_json() for p in plan.patches],
            "files": sorted(plan.files),
            "record": record.id if record else None,
            "upgraded": [
                {"id": p.patch.id, "from": p.recorded_revision, "to": p.patch.revision} for p in plan.upgraded
            ],
            "replaced": [r.id for r in plan.replaces],
            "superseded": [s.to_json() for s in plan.superseded],
            "merged": plan.merged,
            "diff_file": str(self.diff_file) if self.diff_file else None,
            "diff": self.result.diff if request.dry_run else None,
            "recovered": self.result.recovered,
            "worker_path": self.worker_path,
        }


@dataclass
class Applied:
    """`apply_many`'s answer: each tree's apply, the notes on the trees found, and the commands to run next."""

    request: ApplyRequest
    trees: list[TreeApplied]
    notes: list[str]
    trust_record: bool = False

    @property
    def next_commands(self) -> dict[str, list[str]] | None:
        """verify and revert of the trees this run patched (not every registered tree), when it recorded any."""
        if self.request.dry_run or not any(t.result.record for t in self.trees):
            return None
        named = [word for t in self.trees for word in (ROOT_OPTIONS[t.tree.package], str(t.tree.root))]
        named += ["--trust-record"] if self.trust_record else []
        return {"verify": ["rlprobe-patch", "verify", *named], "revert": ["rlprobe-patch", "revert", *named]}

    def to_json(self) -> dict[str, Any]:
        """`trees` is the full answer; the first tree's fields are repeated at the top for one-tree scripts."""
        documents = [t.to_json(self.request) for t in self.trees]
        return {"ok": True, **documents[0], "trees": documents, "notes": self.notes, "next": self.next_commands}


def apply_many(
    roots: Roots,
    request: ApplyRequest,
    read_facts: Callable[[Tree], RunFacts] | None = None,
    progress: Progress = _quiet,
) -> Applied:
    """Apply `request` to every tree `roots` names (else finds), all or nothing: where several trees are written,
    every one is planned and checked before any is written, so that a refusal in one leaves all as they were.
    `read_facts(tree)` reads the launch script's facts against a tree (its worker path, its notices)."""
    trees = roots.for_apply(request.mode, wants_trainer(request.mode, request.only), request.only)
    chosen = select_trees(
        trees,
        backend=request.backend,
        mode=request.mode,
        only=request.only,
        skip=request.skip,
        worker_impl=request.worker_impl,
        script=request.script,
        read_facts=read_facts,
    )
    plans: dict[Path, Plan] = {}
    if len(chosen) > 1 and not request.dry_run:
        for c in chosen:  # refuse everything before writing anything
            progress(f"planning {c.tree.package} {c.tree.version} at {c.tree.root}")
            plans[c.tree.root] = plan_apply(
                c.tree, c.selection, request.params, request.force, merge=request.merge, trust_record=roots.trust_record
            )
            raise_if_refused(plans[c.tree.root])
    applied = [
        TreeApplied(
            c.tree,
            apply(
                c.tree,
                c.selection,
                request.params,
                force=request.force,
                dry_run=request.dry_run,
                merge=request.merge,
                lock_timeout=request.lock_timeout,
                progress=progress,
                plan=plans.get(c.tree.root),
                trust_record=roots.trust_record,
            ),
            c.worker_path,
        )
        for c in chosen
    ]
    return Applied(request, applied, roots.notes, roots.trust_record)


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def apply(
    tree: Tree,
    selection: Selection | str,
    params: dict[str, str] | None = None,
    *,
    force: bool = False,
    dry_run: bool = False,
    merge: bool = False,
    lock_timeout: float = 10.0,
    progress: Progress = _quiet,
    plan: Plan | None = None,
    trust_record: bool = False,
) -> ApplyResult:
    """Apply `selection` to `tree`. `plan`: one made already (by `plan_apply` with the same
    arguments); it is used if the tree has no pending journal and its inputs did not change.
    `merge`: an upgrade keeps edits made after the older revision was applied (three-way)."""
    params = params or {}
    if isinstance(selection, str):
        selection = Selection(selection)
    folder = RecordFolder(tree.root, trust_record)
    folder.read_ledger()  # a damaged record is refused before any answer, "already applied" included

    def make_plan() -> Plan:
        return plan_apply(tree, selection, params, force, merge=merge, folder=folder)

    if dry_run:
        progress(f"planning {tree.package} {tree.version} at {tree.root}")
        plan = plan or make_plan()
        raise_if_refused(plan)
        return ApplyResult(plan, None, [], True, plan.diff())
    # Plan before taking the lock, so that a refusal or a no-op leaves no trace in the tree.
    if folder.read_journal() is not None:
        plan = None  # planned again once the interrupted write is finished
    else:
        if plan is None:
            progress(f"planning {tree.package} {tree.version} at {tree.root}")
            plan = make_plan()
        raise_if_refused(plan)
        if not plan.needs_write:
            return ApplyResult(plan, None, [], False, "")
    with folder.lock(lock_timeout):
        with write_phase(folder, f"finishing an interrupted write in {tree.root}"):
            recovered = recover(folder)
        if plan is None or not plan.inputs_unchanged() or recovered:
            progress(f"planning {tree.package} {tree.version} at {tree.root} again (it changed meanwhile)")
            plan = make_plan()
            raise_if_refused(plan)
        if not plan.needs_write:
            return ApplyResult(plan, None, recovered, False, "")
        progress(f"writing {len(plan.writes)} file(s)")
        with write_phase(folder, f"apply on {tree.root}"):
            record, diff = _write_apply(folder, plan)
        folder.remember_checked(plan.checked)
    return ApplyResult(plan, record, recovered, False, diff)


def _write_apply(folder: RecordFolder, plan: Plan) -> tuple[Record | None, str]:
    tree = plan.tree
    previous = folder.read_ledger()
    ledger = previous.without({r.id for r in plan.replaces} | {s.record.id for s in plan.superseded})
    ledger.root = str(tree.root)  # a tree moved after an earlier apply: the record follows it
    applied = [p for p in plan.patches if p.state is State.APPLICABLE]
    record_id = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    files = []
    before_tree, after_tree = {}, {}
    blobs: dict[str, str] = {}  # path -> blob of the planned content
    for rel, change in sorted(plan.files.items()):
        blobs[rel] = "" if change.after is None else folder.history.store_blob(change.after)
        if not change.recorded:
            continue
        assert change.after is not None  # a record adds or patches files; it never removes one
        before_blob = "" if change.before is None else folder.history.store_blob(change.before)
        fr = FileRecord(rel, change.mode, digest(change.before), digest(change.after), before_blob, blobs[rel])
        files.append(fr)
        if change.before is not None:  # a file the patch adds is absent from the "before" commit
            before_tree[rel] = (fr.before_blob, change.mode)
        after_tree[rel] = (fr.after_blob, change.mode)
    record: Record | None = None
    diff = ""
    branches: dict[str, str] = {}
    head = previous_head = folder.history.branch_head(tree.package)
    if files:
        params = {k: v for p in applied for k, v in p.params.items()}
        patch_list = [PatchRef(p.patch.id, p.patch.revision) for p in applied]
        replaced = [r.id for r in plan.replaces]
        header = provenance_header(
            [
                ("rlprobe-patch record", record_id),
                ("Tool", f"rlprobe-patch {__version__}"),
                ("Patches", ", ".join(f"{p.id} r{p.revision}" for p in patch_list)),
                ("Package", f"{tree.package} {tree.version} ({tree.version_source})"),
                ("Tree", str(tree.root)),
                ("Backend", plan.backend + (f", mode {plan.mode}" if plan.mode else "")),
                ("Params", show_params(params)),
                ("Created", _now()),
            ]
            + ([("Replaces", ", ".join(replaced))] if replaced else [])
            + [("File", f"{f.path} mode={f.mode:o} before=sha256:{f.before} after=sha256:{f.after}") for f in files]
        )
        diff = header + plan.record_diff()
        diff_rel = folder.write_diff(record_id, diff)
        commit_before = folder.history.commit_files(
            before_tree, f"{tree.package} {tree.version}: before {record_id}", head
        )
        message = f"rlprobe-patch {'upgrade' if replaced else 'apply'} {', '.join(p.id for p in patch_list)}"
        head = folder.history.commit_files(after_tree, f"{message}\n\n{header}", commit_before)
        record = Record(
            id=record_id,
            package=tree.package,
            version=str(tree.version),
            tool_version=__version__,
            created=_now(),
            backend=plan.backend,
            mode=plan.mode or next((r.mode for r in plan.replaces if r.mode), ""),  # an upgrade keeps the set
            patches=patch_list,
            params=params,
            files=files,
            diff=diff_rel,
            commit_before=commit_before,
            commit_after=head,
        )
        ledger.records.append(record)
    if head is not None:
        branches[tree.package] = head
    writes = tuple(
        JournalFile(rel, c.mode, digest(c.current), digest(c.after), blobs[rel])
        for rel, c in sorted(plan.writes.items())
    )
    dropped = [r.id for r in plan.replaces] + [s.record.id for s in plan.superseded]
    undo = None
    if record is not None and previous.records:  # written before the tree changes: a kill leaves it valid
        undone = tuple(
            JournalFile(
                rel,
                c.mode,
                digest(c.after),
                digest(c.current),
                folder.history.store_blob(c.current) if c.current is not None else "",
            )
            for rel, c in sorted(plan.writes.items())
        )
        undo = Journal("undo", record_id, undone, previous, {tree.package: previous_head} if previous_head else {})
    folder.write_undo(undo)
    run_journal(folder, Journal("apply", record_id if record else ",".join(dropped), writes, ledger, branches))
    return record, diff
