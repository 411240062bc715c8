"""Verify: our per-site checks, compile checks, the records against the tree and their history,
and the package's own rules (`core.rules`: worker paths, the skill's checkers).

A file whose bytes this patch's code already found APPLIED and compiling (before apply wrote
it, or in an earlier verify) is not parsed or compiled again unless `recheck` (`RecordFolder.checked`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlprobe_patch.base.fsio import sha256
from rlprobe_patch.base.gitsafe import run_git
from rlprobe_patch.catalogue.patches import get_patch
from rlprobe_patch.catalogue.trees import Tree
from rlprobe_patch.codemod import CreateFile, State
from rlprobe_patch.core.checks import Check
from rlprobe_patch.core.rules import package_checks
from rlprobe_patch.core.selection import Selection
from rlprobe_patch.core.sites import Workspace, scopes_of, site_present, site_state
from rlprobe_patch.record.folder import Record, RecordFolder
from rlprobe_patch.record.integrity import diff_problem, hash_problems
from rlprobe_patch.record.sorting import sort_records


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
    others: Mapping[str, Path] | None = None,
    recheck: bool = False,
    run: tuple[Path, dict[str, tuple[Any, str]]] | None = None,
    trust_record: bool = False,
) -> VerifyResult:
    """Our syntax-tree checks, compile checks, recorded post-images, and the package's rules.

    `others`: the roots of the other packages verified with this tree ({package: root}), for
    rules that read several trees. `run`: the training script and its facts
    (`rules.read_run_facts`): the worker path it takes must be the one hooked. Records
    superseded by an upgrade of the package are reported (a warning) and not checked; a patch
    recorded at an older revision is checked against its record and reported as upgradable."""
    folder = RecordFolder(tree.root, trust_record)
    checks: list[Check] = []
    if folder.read_journal() is not None:
        checks.append(
            Check("journal", False, "an interrupted apply/revert is pending; run `rlprobe-patch status` to finish it")
        )
    ledger = folder.read_ledger()
    found_records = sort_records(tree, ledger)
    records = found_records.live
    for s in found_records.superseded:
        checks.append(Check(f"record {s.record.id}", True, f"superseded: {s.reason}; not checked", warning=True))
    outdated = found_records.outdated
    patch_ids = [i for r in records for i in r.patch_ids]
    if selection is not None:
        patch_ids += [p.id for p in selection.patches(tree.package) if p.supports(tree.version)]
    patches = [get_patch(i) for i in dict.fromkeys(patch_ids)]
    if not patches:
        gone = " (its record was superseded: apply again)" if found_records.superseded else ""
        checks.append(
            Check("recorded", False, f"nothing recorded for {tree.root}{gone}; apply first or name --backend")
        )
    if records and ledger.root != str(tree.root):
        checks.append(moved_check(ledger.root, tree.root))
    for record in records:
        checks.append(check_diff(folder, record))
        hashes = hash_problems(folder, record)
        checks.append(Check(f"ledger matches history.git: {record.id}", not hashes, "; ".join(hashes)))
        for f in record.files:
            path = tree.root / f.path
            if not path.is_file():
                checks.append(Check(f"unchanged since apply: {f.path}", False, "file is missing"))
                continue
            changed = sha256(path.read_bytes()) != f.after
            detail = "edited after apply (drift); `rlprobe-patch revert` will show the edit" if changed else ""
            checks.append(Check(f"unchanged since apply: {f.path}", not changed, detail))
    checked_sites = [(p, s) for p in patches if p.id not in outdated for s in p.sites_for(tree.version)]
    ws = Workspace(tree, scopes=scopes_of(checked_sites))
    compiles: dict[str, bool] = {}
    known = set() if recheck else folder.checked()
    found: set[str] = set()
    for patch in patches:
        if patch.id in outdated:  # its sites hold the older revision's code: checked against its record above
            how = f"`rlprobe-patch apply` upgrades it (record {outdated[patch.id].record})"
            checks.append(Check(f"{patch.id}: revision", True, f"{outdated[patch.id].text}: {how}", warning=True))
            continue
        for site in patch.sites_for(tree.version):
            if not site_present(tree, site):
                continue
            st = site_state(ws, patch, site, known)
            work = ws.file(site.target)
            applied = st.state is State.APPLIED
            detail = "file unchanged since its syntax-tree check" if st.remembered else ""
            detail = detail if applied else f"{st.state.value}: {'; '.join(st.reasons)}"
            if isinstance(patch.codemod(site), CreateFile):
                checks.append(Check(f"{patch.id}: {site.target} added", applied, detail))
                if work.base is not None:
                    checks.append(compile_check(site.target, work.base, tree.root))
                continue
            checks.append(Check(f"{patch.id}: hooks in place in {site.target}", applied, detail))
            if work.base is None or work.error is not None:
                continue
            if site.target not in compiles:
                # Remembered bytes compiled when they were remembered (apply compiles what it writes).
                compile_ok = Check(f"compiles: {site.target}", True, "file unchanged since it compiled")
                check = compile_ok if st.remembered else compile_check(site.target, work.base, tree.root)
                compiles[site.target] = check.ok
                checks.append(check)
            if applied and st.key and not st.remembered and compiles[site.target]:
                found.add(st.key)
        facts = {k: v for k, (v, _) in run[1].items()} if run else None
        warnings = patch.warnings_for(tree.version, facts)
        checks += [Check(f"{patch.id}: notice", True, n, warning=True) for n in warnings]
    folder.remember_checked(found)
    more, skill_lines = package_checks(tree, patches, records, run, others or {})
    return VerifyResult(tree, checks + more, skill_lines)


def moved_check(recorded: str, root: Path) -> Check:
    return Check(
        "recorded root",
        True,
        f"the record names {recorded}, the tree is now at {root} (moved or copied after apply); "
        "its paths are relative to the tree and still apply",
        warning=True,
    )


def compile_check(target: str, data: bytes, root: Path) -> Check:
    try:
        compile(data, str(root / target), "exec", dont_inherit=True)
        return Check(f"compiles: {target}", True)
    except SyntaxError as exc:
        return Check(f"compiles: {target}", False, str(exc))


def check_diff(folder: RecordFolder, record: Record) -> Check:
    name = f"recorded diff reverse-applies: {record.diff}"
    problem = diff_problem(folder, record)
    if problem:
        return Check(name, False, problem)
    proc = run_git(["apply", "--check", "-R", str(folder.path / record.diff)], cwd=folder.root, text=True)
    return Check(name, proc.returncode == 0, proc.stderr.strip())
