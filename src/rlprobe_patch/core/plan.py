"""Plan: every change decided in memory before anything is written.

Each patch of the selection is decided site by site (`sites.site_state`): applied, applicable
or drifted. Applicable sites are transformed in memory, each transformed file's code is
generated once and compiled, and every patch is checked again on the final content. A tree
holding a patch at an older revision is planned as an upgrade: its record reversed in memory
(revert's rules: edits made after apply stop it, `merge` keeps them) and the current
revisions applied on top, to be written as one transaction with one new record.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlprobe_patch.base.diffs import unified_diff
from rlprobe_patch.base.errors import RefusedError
from rlprobe_patch.base.fsio import digest, read_or_none
from rlprobe_patch.catalogue.patches import Patch, Site, get_patch
from rlprobe_patch.catalogue.trees import Tree
from rlprobe_patch.codemod import CreateFile, PatchCodemod, State
from rlprobe_patch.core.selection import Selection
from rlprobe_patch.core.sites import Workspace, scopes_of, site_present, site_state
from rlprobe_patch.record.folder import Record, RecordFolder, checked_key
from rlprobe_patch.record.integrity import refuse_damaged
from rlprobe_patch.record.reversal import plan_reversal
from rlprobe_patch.record.sorting import Superseded, TreeRecords, sort_records

NOT_FOR_THIS_RELEASE = "not for this release"
OUTDATED = "outdated"


@dataclass
class PatchPlan:
    patch: Patch
    state: State | None  # None: the patch does not apply to this release (skipped, see reasons)
    reasons: list[str] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # the patch alone does not do the job: say it loudly
    tested: bool = True
    params: dict[str, str] = field(default_factory=dict)
    targets: list[str] = field(default_factory=list)
    skipped: str = ""  # why a patch of a --mode set does not apply to this release
    native: str = ""  # the release does this itself: how to switch it on
    recorded_revision: int | None = None  # an older revision the tree holds (status) or held (an upgrade)

    @property
    def outdated(self) -> bool:
        """The tree holds an older revision, not upgraded by this plan (status)."""
        return self.recorded_revision is not None and self.state is None and not self.skipped and not self.native

    @property
    def state_name(self) -> str:
        if self.outdated:
            return OUTDATED
        if self.state:
            return self.state.value
        return "native" if self.native else NOT_FOR_THIS_RELEASE

    @property
    def revision_text(self) -> str:
        """`applied r1, current r2` for an outdated patch; "" otherwise."""
        if self.recorded_revision is None:
            return ""
        return f"applied r{self.recorded_revision}, current r{self.patch.revision}"

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.patch.id,
            "revision": self.patch.revision,
            "recorded_revision": self.recorded_revision,
            "targets": self.targets,
            "state": self.state_name,
            "reasons": self.reasons,
            "skipped": self.skipped,
            "native": self.native,
            "notices": self.notices,
            "warnings": self.warnings,
            "tested_release": self.tested,
            "params": self.params,
        }


@dataclass(frozen=True)
class Change:
    """One file of a plan: recorded from `before` to `after`, written from `current` to `after`.

    None stands for an absent file. `before` is `current` except in an upgrade, where it is the
    content once the replaced records are reversed (what a later revert restores)."""

    path: str
    before: bytes | None
    after: bytes | None
    mode: int
    current: bytes | None

    @property
    def recorded(self) -> bool:
        return self.before != self.after

    @property
    def written(self) -> bool:
        return self.after != self.current


@dataclass
class Plan:
    tree: Tree
    backend: str
    mode: str | None
    params: dict[str, str]
    patches: list[PatchPlan]
    files: dict[str, Change]  # every file the plan records or writes
    inputs: dict[str, str] = field(default_factory=dict)  # path -> sha256 of what was read
    checked: set[str] = field(default_factory=set)  # `checked_key`s of the final files found APPLIED
    replaces: list[Record] = field(default_factory=list)  # records an upgrade reverses (one new record instead)
    superseded: list[Superseded] = field(default_factory=list)  # dropped from the ledger, files untouched
    merged: list[str] = field(default_factory=list)  # files whose edits made after apply an upgrade keeps

    @property
    def refused(self) -> list[PatchPlan]:
        return [p for p in self.patches if p.reasons]

    @property
    def changes(self) -> dict[str, Change]:
        """The files the new record holds (original -> patched)."""
        return {rel: c for rel, c in self.files.items() if c.recorded}

    @property
    def writes(self) -> dict[str, Change]:
        return {rel: c for rel, c in self.files.items() if c.written}

    @property
    def needs_write(self) -> bool:
        return bool(self.files or self.replaces or self.superseded)

    @property
    def upgraded(self) -> list[PatchPlan]:
        return [p for p in self.patches if p.recorded_revision is not None and p.state is State.APPLICABLE]

    def diff(self) -> str:
        """What the write does to the tree (current -> planned)."""
        return unified_diff({rel: (c.current, c.after) for rel, c in self.writes.items()})

    def record_diff(self) -> str:
        """What the new record holds (original -> patched)."""
        return unified_diff({rel: (c.before, c.after) for rel, c in self.changes.items()})

    def inputs_unchanged(self) -> bool:
        return all(digest(read_or_none(self.tree.root / rel)) == seen for rel, seen in self.inputs.items())


def plan_apply(
    tree: Tree,
    selection: Selection,
    params: dict[str, str],
    force: bool = False,
    check: bool = True,
    *,
    merge: bool = False,
    upgrade: bool = True,
    trust_record: bool = False,
    folder: RecordFolder | None = None,
) -> Plan:
    """Decide every patch of `selection` on `tree` and make the changes in memory.

    `upgrade`: plan the upgrade of records holding older revisions (apply); without it such
    patches are reported as outdated and not decided (status). `merge`: an upgrade keeps edits
    made after apply (three-way), as `revert --merge` does."""
    folder = folder or RecordFolder(tree.root, trust_record)
    records = sort_records(tree, folder.read_ledger()) if folder.exists() else TreeRecords()
    outdated = records.outdated
    replaced: list[Record] = []
    bases: dict[str, tuple[bytes | None, int]] = {}
    merged: list[str] = []
    wanted = selection.patches(tree.package)
    if upgrade and outdated:
        replaced = records.to_upgrade()
        refuse_damaged(folder, replaced)
        ids = [o.patch_id for o in outdated.values()]
        reversal = plan_reversal(
            folder,
            replaced,
            merge,
            what=f"the upgrade of {', '.join(ids)}",
            hint="" if merge else "rerun apply with --merge to keep your edits and upgrade the patch (three-way merge)",
        )
        bases, merged = dict(reversal.contents), reversal.merged
        # The records reversed come back at the current revision, with their parameters.
        ids_wanted = [p.id for p in wanted]
        for record in replaced:
            ids_wanted += [i for i in record.patch_ids if i not in ids_wanted]
        wanted = [get_patch(i) for i in ids_wanted]
        params = {**{k: v for r in replaced for k, v in r.params.items()}, **params}
    if upgrade:
        bases.update(left_by_upgrade(tree, records.superseded, bases))
    ws = Workspace(tree, bases, scopes_of([(p, s) for p in wanted for s in _sites(p, tree)]))
    for rel in bases:  # every file the reversal sets is written, patched again or not
        ws.file(rel)
    plans: list[PatchPlan] = []
    hooked: list[tuple[Patch, PatchCodemod]] = []  # the LibCST sites applied or to apply
    for patch in wanted:
        plan = PatchPlan(patch, State.APPLICABLE, tested=patch.is_tested(tree.version))
        plans.append(plan)
        if patch.id in outdated:
            plan.recorded_revision = outdated[patch.id].recorded
            if not upgrade:
                plan.state = None
                plan.targets = list(
                    dict.fromkeys(s.target for s in patch.sites_for(tree.version) if site_present(tree, s))
                )
                continue
        _plan_patch(ws, plan, selection, params, force, hooked)
    return _finish(tree, selection, params, ws, plans, hooked, check, replaced, records.superseded, merged)


def _plan_patch(
    ws: Workspace,
    plan: PatchPlan,
    selection: Selection,
    params: dict[str, str],
    force: bool,
    hooked: list[tuple[Patch, PatchCodemod]],
) -> None:
    tree, patch = ws.tree, plan.patch
    if patch.is_native(tree.version):
        plan.state, plan.native = None, patch.native_how.format(version=tree.version)
        return
    if not patch.supports(tree.version):
        why = patch.refused_why.format(version=tree.version)
        if not force and not selection.explicit:
            plan.state, plan.skipped = None, why
            return
        if not force:
            plan.state = State.DRIFTED
            plan.reasons.append(f"unsupported release: {why}; supported: {tree.package} {patch.versions}")
            return
        plan.notices.append(f"--force: {why}; trying the anchors anyway")
    plan.notices += patch.notices_for(tree.version, tree.root, selection.facts)
    plan.warnings += patch.warnings_for(tree.version, selection.facts)
    if not plan.tested:
        plan.notices.append(
            f"{tree.package} {tree.version} is not a tested release of {patch.id} "
            f"(tested: {', '.join(patch.tested)}); its anchors matched"
        )
    states: list[State] = []
    for site in _sites(patch, tree):
        if not site_present(tree, site):
            continue  # an optional part of the package this tree does not have
        if site.target not in plan.targets:  # several sites in one file (request-id: two in llm_server.py)
            plan.targets.append(site.target)
        st = site_state(ws, patch, site)
        states.append(st.state)
        codemod = patch.codemod(site)
        if isinstance(codemod, CreateFile):
            plan.reasons += st.reasons
            if st.state is State.APPLICABLE:
                ws.file(site.target).content = codemod.content
            continue
        if st.state is State.DRIFTED and ws.file(site.target).error is not None:
            plan.reasons += st.reasons
            continue
        want = {**codemod.PARAMS, **{k: v for k, v in params.items() if k in codemod.PARAMS}}
        plan.params.update(want)
        if st.state is State.DRIFTED:
            plan.reasons += st.reasons
        elif st.state is State.APPLIED:
            plan.params.update(st.params)
            if st.params != want:
                plan.reasons.append(
                    f"{site.target}: already applied with {show_params(st.params)}, not "
                    f"{show_params(want)}; revert first to change it"
                )
            hooked.append((patch, codemod))
        else:
            new = st.expected if st.params == want else codemod.insert(ws.module(site.target, codemod.scope()), want)
            assert new is not None
            f = ws.file(site.target)
            f.module, f.edited = new, True  # its code is generated once, when every patch is in
            hooked.append((patch, codemod))
    if State.DRIFTED in states:
        plan.state = State.DRIFTED
        plan.reasons.append(drift_hint(patch))
    elif states and all(s is State.APPLIED for s in states):
        plan.state = State.APPLIED
    elif not plan.reasons:
        plan.state = State.APPLICABLE


def _sites(patch: Patch, tree: Tree) -> list[Site]:
    return patch.sites_for(tree.version) or list(patch.sites[-1:])  # --force: the newest layout


def left_by_upgrade(
    tree: Tree, superseded: list[Superseded], taken: dict[str, tuple[bytes | None, int]]
) -> dict[str, tuple[bytes | None, int]]:
    """Files a superseded record added that an upgrade of the package left behind (pip removes
    only the files of its own RECORD), still holding exactly the bytes the record wrote: the plan
    starts from their absence, so apply records them as added again (a later revert removes them)
    or removes them when no patch adds them now. Anything else found at such a path stays."""
    left: dict[str, tuple[bytes | None, int]] = {}
    for s in superseded:
        for f in s.record.files:
            path = tree.root / f.path
            if f.before or f.path in taken or path.is_symlink():
                continue
            if any(p.is_symlink() for p in path.parents if tree.root in p.parents):
                continue
            if digest(read_or_none(path)) == f.after:
                left[f.path] = (None, f.mode)
    return left


def _finish(
    tree: Tree,
    selection: Selection,
    params: dict[str, str],
    ws: Workspace,
    plans: list[PatchPlan],
    hooked: list[tuple[Patch, PatchCodemod]],
    check: bool,
    replaced: list[Record],
    superseded: list[Superseded],
    merged: list[str],
) -> Plan:
    finals: dict[str, bytes | None] = {}
    for rel, f in ws.files.items():  # generate the code of each transformed file once
        if f.edited:
            assert f.module is not None
            code = f.module.code
            if check:
                # What was parsed (placeholders included) compiles: the rest is the file's own text.
                compile_in_memory(tree, rel, code)
            if f.partial is not None:
                code = f.partial.splice(code)
            finals[rel] = code.encode(f.module.encoding)
        else:
            finals[rel] = f.content if f.content is not None else f.base
    checked: set[str] = set()
    for patch, codemod in hooked if check and not any(p.reasons for p in plans) else ():
        f = ws.files[codemod.target]
        data = finals[codemod.target]
        if f.edited:
            # Each patch again on the final file, once all the plan's patches are in: each must be
            # recognised as APPLIED (a second patch on a file must not upset the first).
            assert f.module is not None
            again = codemod.state(f.module)
            if again.state is not State.APPLIED:
                raise RuntimeError(
                    f"{patch.id}: {codemod.target} is not recognised as applied after the transform: {again.reasons}"
                )
        assert data is not None
        checked.add(checked_key(patch.id, codemod.target, patch.fingerprint, data))
    files, inputs = {}, {}
    for rel, f in ws.files.items():
        inputs[rel] = digest(f.disk)
        change = Change(rel, f.base, finals[rel], f.mode, f.disk)
        if change.recorded or change.written:
            files[rel] = change
    return Plan(
        tree, selection.backend, selection.mode, params, plans, files, inputs, checked, replaced, superseded, merged
    )


def raise_if_refused(plan: Plan) -> None:
    refused = plan.refused
    if refused:
        raise RefusedError(
            f"refused to patch {plan.tree.package} {plan.tree.version} at {plan.tree.root}; nothing was written",
            details=[f"{p.patch.id}: {reason}" for p in refused for reason in p.reasons],
        )


def drift_hint(patch: Patch) -> str:
    return (
        f"nothing was written; if this release moved code, {patch.id} needs a new anchor "
        "(report it with this message); if you edited the file, restore it first"
    )


def show_params(params: dict[str, str]) -> str:
    return ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in params.items()) or "default parameters"


def compile_in_memory(tree: Tree, target: str, code: str) -> None:
    """The transformed file must compile before anything is written."""
    try:
        compile(code, str(tree.root / target), "exec", dont_inherit=True)
    except SyntaxError as exc:  # a bug in a codemod, never the user's fault
        raise RuntimeError(f"{target}: the patched code does not compile: {exc}") from exc
