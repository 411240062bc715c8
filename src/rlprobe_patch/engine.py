"""Plan, apply, verify, revert and report: the transaction around the codemods.

Every command first plans in memory (read, parse, decide each patch's state, transform,
check), and only then writes, under the tree's lock, through a journal:

    blobs + commits in history.git, the diff file   (nothing in the tree yet)
    journal.json                                    (what the tree must become)
    each target file: temp + fsync + rename          (modes kept)
    ledger.json, branch, registry
    journal.json removed

A run killed at any point leaves every file either original or patched; the next run finds
the journal, finishes the job (`recover`) and says so.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import libcst as cst

from rlprobe_patch import __version__
from rlprobe_patch.catalogue import Patch, get_patch, load_catalogue, select
from rlprobe_patch.codemod import CreateFile, PatchCodemod, State, StateReport
from rlprobe_patch.diffs import diff_paths, provenance_header, unified_diff
from rlprobe_patch.errors import RefusedError, RevertBlockedError, WriteFailedError
from rlprobe_patch.fsio import atomic_write, checkpoint, fsync_dir, remove_stale_temp_files, sha256
from rlprobe_patch.gitsafe import run_git
from rlprobe_patch.releases import releases
from rlprobe_patch.state import FileRecord, Ledger, Record, StateDir, checked_key
from rlprobe_patch.state_registry import register_tree
from rlprobe_patch.trees import BACKENDS, TRAINERS, Tree

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


# -- reading targets --------------------------------------------------------------------------
def read_target(tree: Tree, rel: str) -> tuple[bytes, cst.Module]:
    path = tree.root / rel
    if path.is_symlink() or any(p.is_symlink() for p in path.parents if tree.root in p.parents):
        raise RefusedError(
            f"{path}: is reached through a symbolic link; refusing to write through it",
            hint="patch the real tree the link points to (pass its path as the root)",
        )
    if not path.is_file():
        raise RefusedError(f"{path}: missing", hint=f"verl {tree.version} does not have this file")
    data = path.read_bytes()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RefusedError(f"{path}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        return data, cst.parse_module(data)
    except cst.ParserSyntaxError as exc:
        raise RefusedError(
            f"{path}:{exc.raw_line}:{exc.raw_column}: syntax error, cannot patch it",
            details=[exc.message],
            hint="the file is broken; reinstall the package",
        ) from None


def file_mode(path: Path) -> int:
    return path.stat().st_mode & 0o7777


# -- planning ---------------------------------------------------------------------------------
NOT_FOR_THIS_RELEASE = "not for this release"


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

    @property
    def state_name(self) -> str:
        if self.state:
            return self.state.value
        return "native" if self.native else NOT_FOR_THIS_RELEASE

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.patch.id,
            "revision": self.patch.revision,
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


@dataclass
class Plan:
    tree: Tree
    backend: str
    mode: str | None
    params: dict[str, str]
    patches: list[PatchPlan]
    changes: dict[str, tuple[bytes | None, bytes, int]]  # path -> (before or None if new, after, mode)
    inputs: dict[str, str] = field(default_factory=dict)  # path -> sha256 of what was read
    checked: set[str] = field(default_factory=set)  # `checked_key`s of the final files found APPLIED

    @property
    def refused(self) -> list[PatchPlan]:
        return [p for p in self.patches if p.reasons]

    def diff(self) -> str:
        return unified_diff({path: (b, a) for path, (b, a, _) in self.changes.items()})

    def inputs_unchanged(self) -> bool:
        return all(digest(read_or_none(self.tree.root / rel)) == seen for rel, seen in self.inputs.items())


@dataclass(frozen=True)
class Selection:
    """What the user asked for: a backend, optionally a mode's patch set, narrowed by --only/--skip."""

    backend: str
    mode: str | None = None
    only: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    refuse_off_range: bool | None = None  # default: refuse when patches were named one by one
    worker_impl: str = "engine"  # verl's worker path to hook: "engine" or "legacy" (see resolve_worker_impl)
    facts: dict[str, Any] | None = None  # the run's values, when `--script` was read (rules notices out)

    def patches(self, package: str) -> list[Patch]:
        known = {p.id: p for p in load_catalogue()}
        unknown = [i for i in (*self.only, *self.skip) if i not in known]
        if unknown:
            raise RefusedError(f"unknown patch id: {', '.join(unknown)}", hint="`rlprobe-patch list` shows them")
        if self.only:
            chosen = [known[i] for i in self.only]
        elif self.mode is None and package not in TRAINERS:
            chosen = [p for p in known.values() if p.package == package]  # SGLang / vLLM-Ascend: their patches
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


def read_run_facts(
    script: Path, tree: Tree, args: list[str] | None = None, env: dict[str, str] | None = None
) -> dict[str, tuple[Any, str]]:
    """{fact: (value, source)} of the run `script` launches, composed with this tree's own config.

    The script is read as bash and Hydra read it (arrays, sourced files, `--env`, `--arg`): the values
    are the ones verl will run with, defaults included."""
    from rlprobe_patch.workflow.scriptmodel import read_script

    found = read_script(script, args=args, env=env, verl_root=tree.root, release=str(tree.version))
    composed = found.composed
    if composed is not None and composed.errors:
        raise RefusedError(f"--script {script}: verl would refuse its overrides", details=composed.errors)
    return {name: (fact.value, fact.source) for name, fact in found.facts.items()}


def resolve_worker_impl(
    tree: Tree, requested: str, script: Path | None = None, facts: dict[str, tuple[Any, str]] | None = None
) -> tuple[str, str]:
    """Which verl worker path the user's PPO actor takes, and why: ("engine" | "legacy", reason)."""
    if requested != "auto":
        return requested, f"--worker-impl {requested}"
    path = releases(tree.package).worker_path(tree.version)
    if not path.setting or script is None or facts is None:
        return path.impl, path.why.format(version=tree.version)
    setting, source = facts.get(path.setting, (None, "not in this release's config"))
    setting = str(setting).lower() if setting is not None else None
    key = f"trainer.{path.setting}={setting}"
    if setting == path.engine_when:
        return "engine", f"{script} runs with {key} ({source}): the engine workers"
    return path.impl, f"{script} runs with {key} ({source}): the {path.impl} workers run the PPO actor"


def hooked_worker_paths(records: list[Record]) -> list[str]:
    """The worker paths ("engine", "legacy") whose hooks the records applied."""
    impls = {get_patch(p["id"]).worker_impl for r in records for p in r.patches}
    backend_hooks = {p["id"] for r in records for p in r.patches if "any" not in get_patch(p["id"]).backends}
    return sorted(impl for impl in impls if any(get_patch(i).worker_impl == impl for i in backend_hooks))


def plan_apply(
    tree: Tree, selection: Selection, params: dict[str, str], force: bool = False, check: bool = True
) -> Plan:
    plans: list[PatchPlan] = []
    current: dict[str, tuple[bytes, cst.Module, int]] = {}
    hooked: list[tuple[Patch, PatchCodemod]] = []  # the LibCST sites applied or to apply
    edited: set[str] = set()  # files whose module in `current` is transformed
    for patch in selection.patches(tree.package):
        plan = PatchPlan(patch, State.APPLICABLE, tested=patch.is_tested(tree.version))
        plans.append(plan)
        if patch.is_native(tree.version):
            plan.state, plan.native = None, patch.native_how.format(version=tree.version)
            continue
        if not patch.supports(tree.version):
            why = patch.refused_why.format(version=tree.version)
            if not force and not selection.explicit:
                plan.state, plan.skipped = None, why
                continue
            if not force:
                plan.state = State.DRIFTED
                plan.reasons.append(f"unsupported release: {why}; supported: {tree.package} {patch.versions}")
                continue
            plan.notices.append(f"--force: {why}; trying the anchors anyway")
        plan.notices += patch.notices_for(tree.version, tree.root, selection.facts)
        plan.warnings += patch.warnings_for(tree.version, selection.facts)
        if not plan.tested:
            plan.notices.append(
                f"{tree.package} {tree.version} is not a tested release of {patch.id} "
                f"(tested: {', '.join(patch.tested)}); its anchors matched"
            )
        sites = patch.sites_for(tree.version) or list(patch.sites[-1:])  # --force: the newest layout
        states: list[State] = []
        for site in sites:
            if not site.required and not (tree.root / site.target).is_file():
                continue  # an optional part of verl this tree does not have
            plan.targets.append(site.target)
            codemod = patch.codemod(site)
            if isinstance(codemod, CreateFile):
                if site.target not in current:
                    path = tree.root / site.target
                    current[site.target] = (path.read_bytes() if path.is_file() else None, None, 0o644)
                report = codemod.state_of(current[site.target][0])
                states.append(report.state)
                plan.reasons += list(report.reasons)
                if report.state is State.APPLICABLE:
                    current[site.target] = (codemod.content, None, 0o644)
                continue
            try:
                if site.target not in current:
                    data, module = read_target(tree, site.target)
                    current[site.target] = (data, module, file_mode(tree.root / site.target))
                data, module, mode = current[site.target]
                report = codemod.state(module)
            except RefusedError as exc:
                states.append(State.DRIFTED)
                plan.reasons.append(exc.message + (f" ({exc.hint})" if exc.hint else ""))
                continue
            states.append(report.state)
            wanted = {**codemod.PARAMS, **{k: v for k, v in params.items() if k in codemod.PARAMS}}
            plan.params.update(wanted)
            if report.state is State.DRIFTED:
                plan.reasons += list(report.reasons)
            elif report.state is State.APPLIED:
                plan.params.update(report.params)
                if report.params != wanted:
                    plan.reasons.append(
                        f"{site.target}: already applied with {_show_params(report.params)}, not "
                        f"{_show_params(wanted)}; revert first to change it"
                    )
                hooked.append((patch, codemod))
            else:
                new = report.expected if report.params == wanted else codemod.insert(module, wanted)
                assert new is not None
                current[site.target] = (data, new, mode)
                edited.add(site.target)  # its code is generated once, when every patch is in
                hooked.append((patch, codemod))
        if State.DRIFTED in states:
            plan.state = State.DRIFTED
            plan.reasons.append(_drift_hint(patch))
        elif states and all(s is State.APPLIED for s in states):
            plan.state = State.APPLIED
        elif not plan.reasons:
            plan.state = State.APPLICABLE
    for rel in edited:  # generate the code of each transformed file once
        _, module, mode = current[rel]
        code = module.code
        if check:
            _compile_in_memory(tree, rel, code)
        current[rel] = (code.encode(module.encoding), module, mode)
    checked: set[str] = set()
    for patch, codemod in hooked if check and not any(p.reasons for p in plans) else ():
        data, module, _ = current[codemod.target]
        if codemod.target in edited:
            # Each patch again on the final file, once all the plan's patches are in: each must be
            # recognised as APPLIED (a second patch on a file must not upset the first).
            again = codemod.state(module)
            if again.state is not State.APPLIED:
                raise RuntimeError(
                    f"{patch.id}: {codemod.target} is not recognised as applied after the transform: {again.reasons}"
                )
        checked.add(checked_key(patch.id, codemod.target, patch.fingerprint, data))
    changes, inputs = {}, {}
    for rel, (data, _, mode) in current.items():
        original = read_or_none(tree.root / rel)
        inputs[rel] = digest(original)
        if data != original:
            changes[rel] = (original, data, mode)
    return Plan(tree, selection.backend, selection.mode, params, plans, changes, inputs, checked)


def read_or_none(path: Path) -> bytes | None:
    """A file's bytes, or None when it does not exist (a file a patch adds)."""
    return path.read_bytes() if path.is_file() else None


def digest(data: bytes | None) -> str:
    """sha256 of the bytes; "" stands for an absent file."""
    return "" if data is None else sha256(data)


def _drift_hint(patch: Patch) -> str:
    return (
        f"nothing was written; if this release moved code, {patch.id} needs a new anchor "
        "(report it with this message); if you edited the file, restore it first"
    )


def _show_params(params: dict[str, str]) -> str:
    return ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in params.items()) or "default parameters"


def _compile_in_memory(tree: Tree, target: str, code: str) -> None:
    """The transformed file must compile before anything is written."""
    try:
        compile(code, str(tree.root / target), "exec", dont_inherit=True)
    except SyntaxError as exc:  # a bug in a codemod, never the user's fault
        raise RuntimeError(f"{target}: the patched code does not compile: {exc}") from exc


# -- applying ---------------------------------------------------------------------------------
@dataclass
class ApplyResult:
    plan: Plan
    record: Record | None
    recovered: list[str]
    dry_run: bool
    diff: str

    @property
    def already_applied(self) -> bool:
        return not self.plan.changes


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def apply(
    tree: Tree,
    selection: Selection | str,
    params: dict[str, str] | None = None,
    *,
    force: bool = False,
    dry_run: bool = False,
    lock_timeout: float = 10.0,
    progress: Progress = _quiet,
    plan: Plan | None = None,
    trust_record: bool = False,
) -> ApplyResult:
    """Apply `selection` to `tree`. `plan`: one made already (by `plan_apply` with the same
    arguments); it is used if the tree has no pending journal and its inputs did not change."""
    params = params or {}
    if isinstance(selection, str):
        selection = Selection(selection)
    state = StateDir(tree.root, trust_record)
    state.read_ledger()  # a damaged record is refused before any answer, "already applied" included
    if dry_run:
        progress(f"planning {tree.package} {tree.version} at {tree.root}")
        plan = plan or plan_apply(tree, selection, params, force)
        raise_if_refused(plan)
        return ApplyResult(plan, None, [], True, plan.diff())
    # Plan before taking the lock, so that a refusal or a no-op leaves no trace in the tree.
    if state.read_journal() is not None:
        plan = None  # planned again once the interrupted write is finished
    else:
        if plan is None:
            progress(f"planning {tree.package} {tree.version} at {tree.root}")
            plan = plan_apply(tree, selection, params, force)
        raise_if_refused(plan)
        if not plan.changes:
            return ApplyResult(plan, None, [], False, "")
    with state.lock(lock_timeout):
        with write_phase(state, f"finishing an interrupted write in {tree.root}"):
            recovered = recover(state)
        if plan is None or not plan.inputs_unchanged():
            progress(f"planning {tree.package} {tree.version} at {tree.root} again (it changed meanwhile)")
            plan = plan_apply(tree, selection, params, force)
            raise_if_refused(plan)
        if not plan.changes:
            return ApplyResult(plan, None, recovered, False, "")
        progress(f"writing {len(plan.changes)} file(s)")
        with write_phase(state, f"apply on {tree.root}"):
            record, diff = _write_apply(state, plan)
        state.remember_checked(plan.checked)
    return ApplyResult(plan, record, recovered, False, diff)


def raise_if_refused(plan: Plan) -> None:
    refused = plan.refused
    if refused:
        raise RefusedError(
            f"refused to patch {plan.tree.package} {plan.tree.version} at {plan.tree.root}; nothing was written",
            details=[f"{p.patch.id}: {reason}" for p in refused for reason in p.reasons],
        )


def _write_apply(state: StateDir, plan: Plan) -> tuple[Record, str]:
    tree = plan.tree
    ledger = state.read_ledger()
    ledger.root = str(tree.root)  # a tree moved after an earlier apply: the record follows it
    applied = [p for p in plan.patches if p.state is State.APPLICABLE]
    record_id = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    files = []
    before_tree, after_tree = {}, {}
    for rel, (before, after, mode) in sorted(plan.changes.items()):
        before_blob = "" if before is None else state.store_blob(before)
        fr = FileRecord(rel, mode, digest(before), sha256(after), before_blob, state.store_blob(after))
        files.append(fr)
        if before is not None:  # a file the patch adds is absent from the "before" commit
            before_tree[rel] = (fr.before_blob, mode)
        after_tree[rel] = (fr.after_blob, mode)
    params = {k: v for p in applied for k, v in p.params.items()}
    patch_list = [{"id": p.patch.id, "revision": p.patch.revision} for p in applied]
    header = provenance_header(
        [
            ("rlprobe-patch record", record_id),
            ("Tool", f"rlprobe-patch {__version__}"),
            ("Patches", ", ".join(f"{p['id']} r{p['revision']}" for p in patch_list)),
            ("Package", f"{tree.package} {tree.version} ({tree.version_source})"),
            ("Tree", str(tree.root)),
            ("Backend", plan.backend + (f", mode {plan.mode}" if plan.mode else "")),
            ("Params", _show_params(params)),
            ("Created", _now()),
        ]
        + [("File", f"{f.path} mode={f.mode:o} before=sha256:{f.before} after=sha256:{f.after}") for f in files]
    )
    diff = header + plan.diff()
    diff_rel = f"diffs/{record_id}.diff"
    (state.path / "diffs").mkdir(exist_ok=True)
    atomic_write(state.path / diff_rel, diff.encode("utf-8", errors="surrogateescape"))
    parent = _branch_head(state, tree.package)
    commit_before = state.commit_files(before_tree, f"{tree.package} {tree.version}: before {record_id}", parent)
    commit_after = state.commit_files(
        after_tree, f"rlprobe-patch apply {', '.join(p['id'] for p in patch_list)}\n\n{header}", commit_before
    )
    record = Record(
        id=record_id,
        package=tree.package,
        version=str(tree.version),
        tool_version=__version__,
        created=_now(),
        backend=plan.backend,
        mode=plan.mode or "",
        patches=patch_list,
        params=params,
        files=files,
        diff=diff_rel,
        commit_before=commit_before,
        commit_after=commit_after,
    )
    ledger.records.append(record)
    _run_journal(
        state,
        {
            "op": "apply",
            "record": record_id,
            "package": tree.package,
            "files": [
                {"path": f.path, "mode": f.mode, "from": f.before, "to": f.after, "blob": f.after_blob} for f in files
            ],
            "ledger": ledger.to_json(),
            "branches": {tree.package: commit_after},
        },
    )
    return record, diff


def _branch_head(state: StateDir, package: str) -> str | None:
    try:
        return state.repo.git.rev_parse("--verify", "--quiet", f"refs/heads/{package}")
    except Exception:
        return None


def _run_journal(state: StateDir, journal: dict[str, Any]) -> None:
    """Write the journal, then carry it out. `recover` carries out one left by a killed run."""
    checkpoint("journal")
    state.write_journal(journal)
    _carry_out(state, journal)


def _carry_out(state: StateDir, journal: dict[str, Any]) -> list[str]:
    problems = []
    for f in journal["files"]:
        path = state.root / f["path"]
        remove_stale_temp_files(path)
        current = digest(read_or_none(path))
        if current == f["to"]:
            if f["to"] and file_mode(path) != f["mode"]:
                os.chmod(path, f["mode"])
            continue
        if current != f["from"]:
            problems.append(f"{f['path']}: changed by someone else during the interrupted run; left as it is")
            continue
        checkpoint(f"write {f['path']}")
        if f["blob"]:
            atomic_write(path, state.read_blob(f["blob"]), f["mode"])
        else:  # revert of a file the patch added
            path.unlink()
            fsync_dir(path.parent)
    checkpoint("ledger")
    state.write_ledger(Ledger.from_json(journal["ledger"]))
    ledger = Ledger.from_json(journal["ledger"])
    for package, commit in journal["branches"].items():
        state.set_branch(package, commit)
        register_tree(state.root, package, present=package in {r.package for r in ledger.records})
    checkpoint("clear journal")
    state.clear_journal()
    return problems


@contextlib.contextmanager
def write_phase(state: StateDir, what: str) -> Iterator[None]:
    """A write the disk refuses (full, I/O error) ends the command cleanly, saying what the tree holds."""
    try:
        yield
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if state.read_journal() is not None:
            raise WriteFailedError(
                f"{what} stopped: {reason}; each file is original or patched, and {state.journal_path} "
                "records the rest",
                hint="free space, then run `rlprobe-patch status` (or any command on the tree) to finish it",
            ) from None
        raise WriteFailedError(
            f"{what} stopped: {reason}; nothing in the tree was changed",
            hint="free space and run the command again",
        ) from None


def recover(state: StateDir) -> list[str]:
    """Finish a write that a killed or interrupted run left half done; say what was done."""
    journal = state.read_journal()
    if journal is None:
        return []
    problems = _carry_out(state, journal)
    return [f"found an interrupted {journal['op']} (record {journal['record']}) and completed it", *problems]


# -- verifying --------------------------------------------------------------------------------
@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""
    warning: bool = False  # passes, but the user must read it

    def to_json(self) -> dict[str, Any]:
        return {"check": self.name, "ok": self.ok, "detail": self.detail, "warning": self.warning}


@dataclass
class VerifyResult:
    tree: Tree
    checks: list[Check]
    skill_output: list[str]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


def verify(
    tree: Tree,
    selection: Selection | None = None,
    vllm_ascend_root: Path | None = None,
    recheck: bool = False,
    run: tuple[Path, dict[str, tuple[Any, str]]] | None = None,
    trust_record: bool = False,
) -> VerifyResult:
    """Our syntax-tree checks, compile checks, recorded post-images, and the skill's rules.

    A file whose bytes this patch's code already found APPLIED (before apply wrote it, or in an
    earlier verify) is not parsed again unless `recheck`; see `StateDir.checked`. `run`: the training
    script and its facts (`read_run_facts`): the worker path it takes must be the one hooked."""
    from rlprobe_patch.skill_checks import check_consistency_patch, check_engine_patch, check_vllm_rules, engine_target

    state = StateDir(tree.root, trust_record)
    checks: list[Check] = []
    if state.read_journal() is not None:
        checks.append(
            Check("journal", False, "an interrupted apply/revert is pending; run `rlprobe-patch status` to finish it")
        )
    ledger = state.read_ledger()
    records = [r for r in ledger.records if r.package == tree.package]
    patch_ids = [p["id"] for r in records for p in r.patches]
    if selection is not None:
        patch_ids += [p.id for p in selection.patches(tree.package) if p.supports(tree.version)]
    patches = [get_patch(i) for i in dict.fromkeys(patch_ids)]
    if not patches:
        checks.append(Check("recorded", False, f"nothing recorded for {tree.root}; apply first or name --backend"))
    if records and ledger.root != str(tree.root):
        checks.append(_moved_check(ledger.root, tree.root))
    for record in records:
        checks.append(_check_diff(state, record))
        hashes = _hash_problems(state, record)
        checks.append(Check(f"ledger matches history.git: {record.id}", not hashes, "; ".join(hashes)))
        for f in record.files:
            path = tree.root / f.path
            if not path.is_file():
                checks.append(Check(f"unchanged since apply: {f.path}", False, "file is missing"))
                continue
            changed = sha256(path.read_bytes()) != f.after
            detail = "edited after apply (drift); `rlprobe-patch revert` will show the edit" if changed else ""
            checks.append(Check(f"unchanged since apply: {f.path}", not changed, detail))
    parsed: dict[str, tuple[bytes, cst.Module]] = {}  # a file several patches hook is read once
    compiled: set[str] = set()
    known = set() if recheck else state.checked()
    found: set[str] = set()
    for patch in patches:
        for site in patch.sites_for(tree.version):
            if not site.required and not (tree.root / site.target).is_file():
                continue
            name = f"{patch.id}: hooks in place in {site.target}"
            codemod = patch.codemod(site)
            if isinstance(codemod, CreateFile):
                name = f"{patch.id}: {site.target} added"
                data = read_or_none(tree.root / site.target)
                report: StateReport = codemod.state_of(data)
                applied = report.state is State.APPLIED
                checks.append(
                    Check(name, applied, "" if applied else f"{report.state.value}: {'; '.join(report.reasons)}")
                )
                if data is not None:
                    checks.append(_compile_check(site.target, data, tree.root))
                continue
            path = tree.root / site.target
            data = path.read_bytes() if path.is_file() and not path.is_symlink() else None
            key = checked_key(patch.id, site.target, patch.fingerprint, data) if data is not None else ""
            if key in known:  # these very bytes were found APPLIED by this code before
                checks.append(Check(name, True, "file unchanged since its syntax-tree check"))
                if site.target not in compiled:
                    compiled.add(site.target)
                    checks.append(_compile_check(site.target, data, tree.root))  # type: ignore[arg-type]
                continue
            try:
                if site.target not in parsed:
                    parsed[site.target] = read_target(tree, site.target)
            except RefusedError as exc:
                checks.append(Check(name, False, exc.message))
                continue
            if site.target not in compiled:
                compiled.add(site.target)
                checks.append(_compile_check(site.target, parsed[site.target][0], tree.root))
            report = codemod.state(parsed[site.target][1])
            applied = report.state is State.APPLIED
            if applied and parsed[site.target][0] == data:
                found.add(key)
            checks.append(Check(name, applied, "" if applied else f"{report.state.value}: {'; '.join(report.reasons)}"))
        facts = {k: v for k, (v, _) in run[1].items()} if run else None
        warnings = patch.warnings_for(tree.version, facts)
        checks += [Check(f"{patch.id}: notice", True, n, warning=True) for n in warnings]
    state.remember_checked(found)
    skill_lines: list[str] = []
    # The skill's engine check applies to verl's engine hooks; legacy worker hooks live elsewhere.
    engines = sorted(
        {
            b
            for p in patches
            if p.package == "verl" and p.worker_impl == "engine"
            for b in p.backends
            if b in ("fsdp", "megatron")
        }
    )
    legacy = sorted({b for p in patches if p.worker_impl == "legacy" for b in p.backends if b in ("fsdp", "megatron")})
    paths = hooked_worker_paths(records)
    if paths:
        checks.append(Check("worker path hooked", True, ", ".join(paths)))
    if run is not None and tree.package == "verl" and paths:
        impl, why = resolve_worker_impl(tree, "auto", run[0], run[1])
        detail = why if impl in paths else f"{why}; hooked: {', '.join(paths)}: the run would dump nothing"
        checks.append(Check(f"worker path of {run[0].name}", impl in paths, detail))
    for b in engines:
        ok, lines = check_engine_patch(tree.root, b)
        skill_lines += lines
        checks.append(Check(f"skill check-engine-patch --backend {b}", ok, "; ".join(lines[1:])))
    if tree.package == "vllm_ascend" and patches:
        ok, lines = check_vllm_rules(tree.root)
        skill_lines += lines
        checks.append(Check("skill check-consistency-patch vLLM-Ascend rules", ok, "; ".join(lines[1:])))
    if tree.package == "verl" and any("consistency" in p.modes and "any" in p.backends for p in patches):
        # The skill's rules expect every patch of the set; a release that cannot take one of
        # them fails those rules by design (its target, and the lines the release data names).
        # Such FAIL lines are shown, and do not fail verify.
        by_design = [p for p in select(tree.package, "fsdp", "consistency") if not p.supports(tree.version)]
        expected_fail = {str(tree.root / t) for p in by_design for t in p.targets}
        expected_fail |= {line for p in by_design for line in releases(tree.package).expected_checker_fails(p.id)}
        for b in engines or legacy or ["fsdp"]:
            expected = set(expected_fail)
            if b not in engines:  # the legacy workers are hooked instead of the engine file the skill checks
                expected.add(str(tree.root / engine_target(b)))
            ok, lines = check_consistency_patch(
                tree.root, b, vllm_ascend_root=vllm_ascend_root, skip_vllm=vllm_ascend_root is None
            )
            skill_lines += lines
            failed = [line[len("FAIL: ") :] for line in lines if line.startswith("FAIL: ")]
            unexpected = [f for f in failed if f not in expected]
            detail = "; ".join(unexpected) or (
                f"FAIL only where verl {tree.version} cannot take a patch or the legacy workers are hooked: "
                + ", ".join(failed)
                if failed
                else ""
            )
            checks.append(Check(f"skill check-consistency-patch --backend {b}", not unexpected, detail))
    return VerifyResult(tree, checks, skill_lines)


def _moved_check(recorded: str, root: Path) -> Check:
    return Check(
        "recorded root",
        True,
        f"the record names {recorded}, the tree is now at {root} (moved or copied after apply); "
        "its paths are relative to the tree and still apply",
        warning=True,
    )


def _compile_check(target: str, data: bytes, root: Path) -> Check:
    try:
        compile(data, str(root / target), "exec", dont_inherit=True)
        return Check(f"compiles: {target}", True)
    except SyntaxError as exc:
        return Check(f"compiles: {target}", False, str(exc))


def _diff_problem(state: StateDir, record: Record) -> str:
    """Why the record's diff cannot be trusted ("" when it can): missing, outside the tree, other files."""
    path = state.path / record.diff
    if not path.is_file():
        return f"{record.diff}: the diff file is missing"
    try:
        paths = diff_paths(path.read_text(encoding="utf-8", errors="surrogateescape"))
    except RefusedError as exc:
        return f"{record.diff}: {exc.message}"
    if sorted(paths) != sorted(f.path for f in record.files):
        return f"{record.diff}: the diff and the ledger name different files"
    return ""


def _hash_problems(state: StateDir, record: Record) -> list[str]:
    """Files whose hashes in ledger.json do not match the blobs history.git holds for them."""
    problems = []
    for f in record.files:
        for side, blob, want in (("before", f.before_blob, f.before), ("after", f.after_blob, f.after)):
            if not want and not blob:
                continue  # a file the patch added has no "before"
            try:
                ok = sha256(state.read_blob(blob)) == want
            except Exception:  # not a blob id, or absent from history.git
                ok = False
            if not ok:
                problems.append(f"{f.path}: the {side} hash in ledger.json does not match history.git")
    return problems


def _check_diff(state: StateDir, record: Record) -> Check:
    name = f"recorded diff reverse-applies: {record.diff}"
    path = state.path / record.diff
    problem = _diff_problem(state, record)
    if problem:
        return Check(name, False, problem)
    proc = run_git(["apply", "--check", "-R", str(path)], cwd=state.root, text=True)
    return Check(name, proc.returncode == 0, proc.stderr.strip())


# -- reverting --------------------------------------------------------------------------------
@dataclass
class RevertResult:
    tree: Tree | None
    root: Path
    reverted: list[Record]
    files: list[str]
    merged: list[str]
    recovered: list[str]
    dry_run: bool
    diff: str
    moved_from: str = ""  # the root the record names, when the tree was moved after apply


def revert(
    root: Path,
    tree: Tree | None = None,
    *,
    merge: bool = False,
    dry_run: bool = False,
    lock_timeout: float = 10.0,
    progress: Progress = _quiet,
    trust_record: bool = False,
) -> RevertResult:
    state = StateDir(root, trust_record)
    if not state.exists():
        raise RefusedError(f"nothing recorded for {root}: no patch of rlprobe-patch to revert")
    with state.lock(lock_timeout), write_phase(state, f"revert of {root}"):
        recovered = [] if dry_run else recover(state)
        ledger = state.read_ledger()
        moved_from = ledger.root if ledger.records and ledger.root != str(root) else ""
        if not ledger.records:
            return RevertResult(tree, root, [], [], [], recovered, dry_run, "")
        damaged = [p for r in ledger.records for p in [_diff_problem(state, r), *_hash_problems(state, r)] if p]
        if damaged:
            raise RefusedError(
                f"the record in {state.path} does not match its history; nothing was written",
                details=damaged,
                hint="ledger.json or diffs/ were edited by hand or damaged: restore them, or reinstall the "
                "package and delete the folder",
            )
        progress(f"planning the revert of {len(ledger.records)} record(s)")
        targets, merged = _plan_revert(state, ledger, merge)
        diff = unified_diff({rel: (cur, new) for rel, (cur, new, _, _) in targets.items()})
        reverted = list(reversed(ledger.records))
        if dry_run:
            return RevertResult(tree, root, reverted, sorted(targets), merged, recovered, True, diff, moved_from)
        packages = {r.package for r in ledger.records}
        files = []
        for rel, (cur, new, mode, blob) in sorted(targets.items()):
            files.append({"path": rel, "mode": mode, "from": digest(cur), "to": digest(new), "blob": blob})
        branches = {}
        for package in sorted(packages):
            package_files = {f.path for r in ledger.records if r.package == package for f in r.files}
            tree_files = {
                rel: (blob, mode) for rel, (_, _, mode, blob) in targets.items() if blob and rel in package_files
            }
            message = f"rlprobe-patch revert {', '.join(r.id for r in reverted if r.package == package)}"
            branches[package] = state.commit_files(tree_files, message, _branch_head(state, package))
        progress(f"writing {len(files)} file(s)")
        _run_journal(
            state,
            {
                "op": "revert",
                "record": ",".join(r.id for r in reverted),
                "files": files,
                "ledger": Ledger(root=str(root)).to_json(),
                "branches": branches,
            },
        )
    return RevertResult(tree, root, reverted, sorted(targets), merged, recovered, False, diff, moved_from)


def _plan_revert(
    state: StateDir, ledger: Ledger, merge: bool
) -> tuple[dict[str, tuple[bytes | None, bytes | None, int, str]], list[str]]:
    """{path: (current, reverted, mode, blob of reverted)}, None for an absent file; refuses on edits."""
    current: dict[str, bytes | None] = {}
    result: dict[str, bytes | None] = {}
    modes: dict[str, int] = {}
    merged: list[str] = []
    blocked: list[str] = []
    for record in reversed(ledger.records):
        for f in record.files:
            path = state.root / f.path
            if f.path not in result:
                current[f.path] = result[f.path] = read_or_none(path)
                if current[f.path] is None and f.before:
                    blocked.append(f"{f.path}: deleted after apply; reinstall the package to restore it")
                    continue
            data = result[f.path]
            modes[f.path] = f.mode
            if digest(data) == f.after:
                result[f.path] = state.read_blob(f.before_blob) if f.before else None
            elif digest(data) == f.before:
                continue  # already reverted by hand
            else:
                assert data is not None
                patched = state.read_blob(f.after_blob)
                edit = unified_diff({f.path: (patched, data)})
                if not merge or not f.before:
                    why = "edited after apply" if f.before else "a file this patch added, edited after apply"
                    blocked.append(f"{f.path}: {why}; your edit (patched -> now):\n{edit}")
                    continue
                ok, out = _merge3(data, patched, state.read_blob(f.before_blob))
                if not ok:
                    blocked.append(f"{f.path}: your edit overlaps the patch; cannot merge it. Your edit:\n{edit}")
                    continue
                result[f.path] = out
                merged.append(f.path)
    if blocked:
        raise RevertBlockedError(
            "revert stopped: a patched file changed after apply; nothing was written",
            details=blocked,
            hint="" if merge else "rerun with --merge to keep your edits and remove only the patch (three-way merge)",
        )
    targets = {}
    for rel, new in result.items():
        if new != current[rel]:
            targets[rel] = (current[rel], new, modes[rel], "" if new is None else state.store_blob(new))
    return targets, merged


def _merge3(current: bytes, base: bytes, other: bytes) -> tuple[bool, bytes]:
    """Apply base->other onto current (git merge-file); ok is False on conflicts."""
    with tempfile.TemporaryDirectory(prefix="rlprobe-merge-") as tmp:
        paths = []
        for name, data in (("current", current), ("patched", base), ("original", other)):
            p = Path(tmp, name)
            p.write_bytes(data)
            paths.append(str(p))
        proc = run_git(["merge-file", "-p", *paths])
    return proc.returncode == 0, proc.stdout


# -- status -----------------------------------------------------------------------------------
@dataclass
class StatusResult:
    tree: Tree
    patches: list[PatchPlan]
    records: list[Record]
    recovered: list[str]
    pending_journal: bool
    worker_paths: list[str] = field(default_factory=list)  # verl worker paths whose hooks are applied


def status(tree: Tree, backend: str | None = None, trust_record: bool = False) -> StatusResult:
    """Every catalogue patch of the tree's package (or of one backend) and its state."""
    state = StateDir(tree.root, trust_record)
    recovered: list[str] = []
    if state.read_journal() is not None and os.access(state.path, os.W_OK):
        with state.lock(10.0), write_phase(state, f"finishing an interrupted write in {tree.root}"):
            recovered = recover(state)
    ledger = state.read_ledger()
    records = [r for r in ledger.records if r.package == tree.package]
    ids = tuple(p.id for p in load_catalogue() if p.package == tree.package and (backend is None or p.serves(backend)))
    selection = Selection(backend or "fsdp", only=ids, refuse_off_range=False)
    plan = plan_apply(tree, selection, {}, check=False)
    return StatusResult(
        tree, plan.patches, records, recovered, state.read_journal() is not None, hooked_worker_paths(records)
    )
