"""The patch commands: apply, verify, status, revert, forget, list, demo and the skill's checkers.

Each is a plain click command; `cli.py` assembles them (and the workflow, matrix and cluster
commands) into `rlprobe-patch`. The engine is imported inside each command.
"""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click
from packaging.version import Version

from rlprobe_patch.cli_base import (
    Out,
    Roots,
    command,
    parse_ids,
    print_notices,
    print_tree,
    skill_report,
    tree_options,
)
from rlprobe_patch.errors import ExitCode, RefusedError
from rlprobe_patch.releases import releases
from rlprobe_patch.trees import BACKENDS, MODES, TRAINERS, WORKER_IMPLS
from rlprobe_patch.workflow.options import read_options, reader_options


# -- apply ------------------------------------------------------------------------------------
@click.command("apply")
@tree_options
@click.option("--backend", type=click.Choice(BACKENDS), help="Training backend to hook (needed for verl).")
@click.option(
    "--mode",
    type=click.Choice(MODES),
    help="Apply the whole patch set of a collection mode (consistency: engine hook, PROMPTS_ONLY trimming, "
    "guards, request id, and the SGLang / vLLM-Ascend patches; inference: SGLang without native msprobe). "
    "Without it: the backend's engine hook, and the patches of the SGLang / vLLM-Ascend trees named.",
)
@click.option("--only", "only", metavar="ID[,ID]", help="Apply just these patches (ids from `rlprobe-patch list`).")
@click.option("--skip", "skip", metavar="ID[,ID]", help="Leave these patches out of the set.")
@click.option("--dry-run", is_flag=True, help="Print the unified diff; write nothing.")
@click.option(
    "--force", is_flag=True, help="Allow a release outside the patch's version range (anchors still checked)."
)
@click.option(
    "--worker-impl",
    type=click.Choice(WORKER_IMPLS),
    default="auto",
    show_default=True,
    help="verl's worker path to hook: the engine workers or the legacy fsdp/megatron workers. auto: the one the "
    "release runs the PPO actor through (0.6.x legacy; 0.7.x trainer.use_legacy_worker_impl, read from --script; "
    "0.8+ engine).",
)
@click.option(
    "--script", type=click.Path(path_type=Path), help="The training script, to read which worker path it uses."
)
@reader_options
@click.option("--msprobe-config", metavar="PATH", help="Default msprobe config.json baked into the verl hooks.")
@click.option("--sglang-config", metavar="PATH", help="Default msprobe config.json baked into the SGLang hook.")
@click.option(
    "--merge",
    is_flag=True,
    help="Upgrading a patch applied at an older revision: keep edits made to its files since (three-way merge) "
    "instead of stopping.",
)
@click.option("--lock-timeout", type=float, default=10.0, show_default=True, help="Seconds to wait for another run.")
@command
def apply_cmd(
    out: Out,
    python: str | None,
    verl_root: Path | None,
    sglang_root: Path | None,
    vllm_ascend_root: Path | None,
    backend: str | None,
    mode: str | None,
    only: str | None,
    skip: str | None,
    dry_run: bool,
    force: bool,
    worker_impl: str,
    script: Path | None,
    msprobe_config: str | None,
    sglang_config: str | None,
    merge: bool,
    lock_timeout: float,
    trust_record: bool,
    **reader: Any,
) -> int:
    """Patch verl (engine of BACKEND, or a mode's set), SGLang and vLLM-Ascend; each change a revertible diff."""
    from rlprobe_patch.apply import apply
    from rlprobe_patch.diffs import diffstat
    from rlprobe_patch.plan import Plan, Selection, plan_apply, raise_if_refused
    from rlprobe_patch.rules import read_run_facts, resolve_worker_impl

    roots = Roots(verl_root, sglang_root, vllm_ascend_root, python)
    only_ids, skip_ids = parse_ids(only), parse_ids(skip)
    needs_verl = (mode is None and not only_ids) or any(i.split(".")[0] in TRAINERS for i in only_ids)
    trees = roots.for_apply(mode, needs_verl)
    params = {k: v for k, v in (("msprobe_config", msprobe_config), ("sglang_config", sglang_config)) if v}
    selections = []
    worker_paths: dict[Path, dict[str, str]] = {}
    facts: dict[str, tuple[Any, str]] | None = None
    for tree in trees:
        ids = tuple(i for i in only_ids if i.split(".")[0] == tree.package.replace("_", "-"))
        if only_ids and not ids:
            continue  # --only names no patch of this tree
        impl, why = "engine", ""
        if tree.package == "verl":
            if backend is None:
                raise click.UsageError("--backend is required to patch verl (fsdp, fsdp2 or megatron)")
            facts = read_run_facts(script, tree, **read_options(dict(reader))) if script is not None else None
            impl, why = resolve_worker_impl(tree, worker_impl, script, facts)
            worker_paths[tree.root] = {"impl": impl, "why": why}
        run_facts = {k: v for k, (v, _) in facts.items()} if tree.package == "verl" and facts else None
        # A framework with one training backend hooked (slime: Megatron) needs no --backend.
        chosen = backend or releases(tree.package).default_backend or "any"
        selections.append((tree, Selection(chosen, mode, ids, skip_ids, worker_impl=impl, facts=run_facts)))
    if not selections:
        raise RefusedError("no patch selected for the trees given", hint="`rlprobe-patch list` shows the patches")
    plans: dict[Path, Plan] = {}
    if len(selections) > 1 and not dry_run:
        for tree, selection in selections:  # refuse everything before writing anything
            out.progress(f"planning {tree.package} {tree.version} at {tree.root}")
            plans[tree.root] = plan_apply(tree, selection, params, force, merge=merge, trust_record=trust_record)
            raise_if_refused(plans[tree.root])
    results = [
        (
            tree,
            apply(
                tree,
                sel,
                params,
                force=force,
                dry_run=dry_run,
                merge=merge,
                lock_timeout=lock_timeout,
                progress=out.progress,
                plan=plans.get(tree.root),
                trust_record=trust_record,
            ),
        )
        for tree, sel in selections
    ]
    documents: list[dict[str, Any]] = []
    for tree, result in results:
        plan = result.plan
        documents.append(
            {
                "status": "dry-run" if dry_run else ("already applied" if result.already_applied else "applied"),
                "tree": tree.to_json(),
                "backend": backend,
                "mode": mode,
                "patches": [p.to_json() for p in plan.patches],
                "files": sorted(plan.files),
                "record": result.record.id if result.record else None,
                "upgraded": [
                    {"id": p.patch.id, "from": p.recorded_revision, "to": p.patch.revision} for p in plan.upgraded
                ],
                "replaced": [r.id for r in plan.replaces],
                "superseded": [s.to_json() for s in plan.superseded],
                "merged": plan.merged,
                "diff_file": str(tree.root / ".rlprobe-patch" / result.record.diff) if result.record else None,
                "diff": result.diff if dry_run else None,
                "recovered": result.recovered,
                "worker_path": worker_paths.get(tree.root),
            }
        )
    # "trees" is the full answer; the first tree's fields are repeated at the top for one-tree scripts.
    out.emit({"ok": True, **documents[0], "trees": documents})
    for (tree, result), document in zip(results, documents):
        plan = result.plan
        print_tree(out, tree)
        hooked = worker_paths.get(tree.root)
        if hooked:
            out.line(f"worker path hooked: {hooked['impl']} ({hooked['why']})")
        for message in result.recovered:
            out.line(f"recovered: {message}", fg="yellow")
        for s in plan.superseded:
            word = "drops" if dry_run else "dropped"
            out.line(f"{word} record {s.record.id}: superseded, {s.reason}; no file touched", fg="yellow")
        for p in plan.patches:
            after = {"applicable": "would apply" if dry_run else "applied", "applied": "already applied"}
            word = after.get(p.state_name, p.state_name)
            if p in plan.upgraded:
                word = f"{'would upgrade' if dry_run else 'upgraded'} r{p.recorded_revision} -> r{p.patch.revision}"
            out.line(f"  {p.patch.id:<28} {word:<20} {', '.join(p.targets)}")
            for text in (p.skipped, p.native):
                if text:
                    out.line(f"      {text}", fg="yellow")
        print_notices(out, plan.patches)
        for path in plan.merged:
            out.line(f"  kept your edits in {path} (three-way merge)", fg="yellow")
        skipped = [p.patch.id for p in plan.patches if p.skipped]
        if skipped:
            still = [p.patch.id for p in plan.patches if not p.skipped and not p.native]
            out.line(f"not for this release: {', '.join(skipped)}; in place: {', '.join(still)}", fg="yellow")
        if dry_run:
            out.line(result.diff or "(no change)")
        elif result.already_applied:
            out.line(
                "already applied: nothing written" if any(p.state for p in plan.patches) else "nothing to write",
                fg="green",
            )
        elif result.record is None:
            out.line("record(s) dropped: no file written", fg="green")
        else:
            for path, added, removed in diffstat(result.diff):
                out.line(f"  {path} | +{added} -{removed}")
            if plan.replaces:
                out.line(f"replaces record(s) {', '.join(r.id for r in plan.replaces)}", fg="green")
            out.line(f"recorded: {document['diff_file']}", fg="green")
    if not dry_run and any(r.record for _, r in results):
        out.line("next: rlprobe-patch verify    (undo: rlprobe-patch revert)")
    return int(ExitCode.OK)


# -- verify -----------------------------------------------------------------------------------
@click.command("verify")
@tree_options
@click.option(
    "--backend", type=click.Choice(BACKENDS), help="Also check this backend's hook (default: what was applied)."
)
@click.option("--mode", type=click.Choice(MODES), help="Also check this mode's patch set.")
@click.option(
    "--recheck",
    is_flag=True,
    help="Parse every hooked file again, also those whose bytes were already found patched by this version.",
)
@click.option(
    "--script",
    type=click.Path(path_type=Path),
    help="The training script: fail when the worker path its run takes is not the one hooked.",
)
@reader_options
@command
def verify_cmd(
    out: Out,
    python: str | None,
    verl_root: Path | None,
    sglang_root: Path | None,
    vllm_ascend_root: Path | None,
    backend: str | None,
    mode: str | None,
    recheck: bool,
    trust_record: bool,
    script: Path | None,
    **reader: Any,
) -> int:
    """Check the hooks (syntax tree, compile, recorded post-image, the skill's rules)."""
    from rlprobe_patch.plan import Selection
    from rlprobe_patch.rules import read_run_facts
    from rlprobe_patch.verify import verify

    selection = Selection(backend or "fsdp", mode) if backend or mode else None
    roots = Roots(verl_root, sglang_root, vllm_ascend_root, python)
    trees = roots.for_records()
    reading = read_options(reader)
    results = [
        verify(
            tree,
            selection if tree.package == "verl" else None,
            {t.package: t.root for t in trees if t is not tree},
            recheck=recheck,
            run=(script, read_run_facts(script, tree, **reading)) if script and tree.package == "verl" else None,
            trust_record=trust_record,
        )
        for tree in trees
    ]
    ok = all(r.ok for r in results)
    out.emit(
        {
            "ok": ok,
            "trees": [
                {
                    "tree": r.tree.to_json(),
                    "ok": r.ok,
                    "checks": [c.to_json() for c in r.checks],
                    "skill": r.skill_output,
                }
                for r in results
            ],
            "gone": roots.gone,
        }
    )
    for r in results:
        print_tree(out, r.tree)
        for c in r.checks:
            word = "WARN" if c.warning else ("PASS" if c.ok else "FAIL")
            out.line(
                f"  {word}  {c.name}" + (f": {c.detail}" if c.detail and (c.warning or not c.ok) else ""),
                fg="yellow" if c.warning else (None if c.ok else "red"),
            )
    roots.print_gone(out)
    out.line("verified" if ok else "verification FAILED", fg="green" if ok else "red", bold=True)
    return int(ExitCode.OK if ok else ExitCode.VERIFY_FAILED)


@click.command("check-engine-patch")
@click.option("--verl-root", type=click.Path(path_type=Path), required=True)
@click.option("--backend", type=click.Choice(["fsdp", "megatron"]), required=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of the skill's lines.")
def check_engine_patch_cmd(verl_root: Path, backend: str, as_json: bool) -> None:
    """The skill's check-engine-patch, same markers, wording and exit codes (0 PASS, 1 FAIL)."""
    from rlprobe_patch.skill_checks import check_engine_patch

    skill_report(*check_engine_patch(verl_root, backend), as_json)


@click.command("check-consistency-patch")
@click.option("--verl-root", type=click.Path(path_type=Path), required=True)
@click.option("--backend", type=click.Choice(["fsdp", "megatron"]), default="fsdp", show_default=True)
@click.option("--vllm-ascend-root", default="", help="Also check the vLLM-Ascend DispatchLogger files.")
@click.option("--skip-vllm", is_flag=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of the skill's lines.")
def check_consistency_patch_cmd(
    verl_root: Path, backend: str, vllm_ascend_root: str, skip_vllm: bool, as_json: bool
) -> None:
    """The skill's check-consistency-patch: same rules, PASS/FAIL/INFO wording and exit codes."""
    from rlprobe_patch.skill_checks import check_consistency_patch

    ok, lines = check_consistency_patch(
        verl_root, backend, Path(vllm_ascend_root) if vllm_ascend_root else None, skip_vllm
    )
    skill_report(ok, lines, as_json)


# -- revert -----------------------------------------------------------------------------------
@click.command("revert")
@tree_options
@click.option("--merge", is_flag=True, help="Keep edits made after apply (three-way merge) instead of stopping.")
@click.option("--dry-run", is_flag=True, help="Print what revert would write; write nothing.")
@click.option(
    "--back-to",
    metavar="RECORD[,RECORD]",
    help="Only undo the newest apply, back to exactly these records (cluster apply's rollback of an upgrade).",
)
@click.option("--lock-timeout", type=float, default=10.0, show_default=True)
@command
def revert_cmd(
    out: Out,
    python: str | None,
    verl_root: Path | None,
    sglang_root: Path | None,
    vllm_ascend_root: Path | None,
    merge: bool,
    dry_run: bool,
    back_to: str | None,
    lock_timeout: float,
    trust_record: bool,
) -> int:
    """Restore, byte for byte, what apply changed; never destroys later edits."""
    from rlprobe_patch.revert import back_to as undo_newest
    from rlprobe_patch.revert import revert
    from rlprobe_patch.state import StateDir

    found = Roots(verl_root, sglang_root, vllm_ascend_root, python)
    trees = found.for_records()
    roots = list(dict.fromkeys(t.root for t in trees))  # trees sharing a root (site-packages) share one record
    if len(roots) > 1:
        roots = [r for r in roots if StateDir(r).exists()] or roots[:1]
    if back_to is not None and (merge or dry_run or len(roots) > 1):
        raise RefusedError(
            "--back-to undoes the newest apply of one tree as it was written: one tree, no --merge, no --dry-run"
        )
    if back_to is not None:
        ids = [i for i in back_to.split(",") if i]
        results = [
            undo_newest(roots[0], ids, lock_timeout=lock_timeout, progress=out.progress, trust_record=trust_record)
        ]
    else:
        results = [
            revert(
                root,
                next(t for t in trees if t.root == root),
                merge=merge,
                dry_run=dry_run,
                lock_timeout=lock_timeout,
                progress=out.progress,
                trust_record=trust_record,
            )
            for root in roots
        ]
    out.emit(
        {
            "ok": True,
            "trees": [
                {
                    "root": str(r.root),
                    "reverted": [rec.id for rec in r.reverted],
                    "files": r.files,
                    "merged": r.merged,
                    "recovered": r.recovered,
                    "dry_run": r.dry_run,
                    "diff": r.diff if r.dry_run else None,
                    "moved_from": r.moved_from or None,
                    "superseded": [s.to_json() for s in r.superseded],
                }
                for r in results
            ],
            "gone": found.gone,
        }
    )
    for r in results:
        out.line(f"{r.root}", bold=True)
        if r.moved_from:
            out.line(f"notice: the record names {r.moved_from}; the tree moved here after apply", fg="yellow")
        for message in r.recovered:
            out.line(f"recovered: {message}", fg="yellow")
        for s in r.superseded:
            word = "would drop" if r.dry_run else "dropped"
            out.line(f"  {word} record {s.record.id}: superseded, {s.reason}; no file touched", fg="yellow")
        if not r.reverted:
            out.line("  nothing applied: nothing to revert")
            continue
        if r.dry_run:
            out.line(r.diff)
            continue
        for rec in r.reverted:
            out.line(f"  reverted {', '.join(rec.patch_ids)} (record {rec.id})", fg="green")
        for path in r.merged:
            out.line(f"  kept your edits in {path} (three-way merge)", fg="yellow")
    found.print_gone(out)
    return int(ExitCode.OK)


# -- status -----------------------------------------------------------------------------------
@click.command("status")
@tree_options
@click.option("--backend", type=click.Choice(BACKENDS), help="Only the patches of this backend.")
@click.option("--prune", is_flag=True, help="Drop the registered trees that are gone from the registry.")
@command
def status_cmd(
    out: Out,
    python: str | None,
    verl_root: Path | None,
    sglang_root: Path | None,
    vllm_ascend_root: Path | None,
    backend: str | None,
    prune: bool,
    trust_record: bool,
) -> int:
    """Per tree: path, version, every patch and its state (applied / applicable / drifted / native);
    every registered tree, those gone included."""
    from rlprobe_patch.rules import has_worker_paths
    from rlprobe_patch.state_registry import forget_trees, registered_trees
    from rlprobe_patch.status import status

    roots = Roots(verl_root, sglang_root, vllm_ascend_root, python)
    if not roots.given and python is None and not registered_trees():
        roots.python = sys.executable  # nothing named or registered: what this Python imports
    trees = roots.for_records(all_gone_ok=True)
    results = [status(tree, backend, trust_record) for tree in trees]
    pruned = forget_trees(roots.gone) if prune and roots.gone else []
    out.emit(
        {
            "ok": True,
            "trees": [
                {
                    "tree": r.tree.to_json(),
                    "patches": [p.to_json() for p in r.patches],
                    "records": [
                        {"id": rec.id, "patches": [asdict(p) for p in rec.patches], "backend": rec.backend}
                        for rec in r.records
                    ],
                    "superseded": [s.to_json() for s in r.superseded],
                    "recovered": r.recovered,
                    "worker_paths": r.worker_paths,
                    "pending_journal": r.pending_journal,
                }
                for r in results
            ],
            "gone": roots.gone,
            "pruned": pruned,
        }
    )
    for r in results:
        print_tree(out, r.tree)
        if has_worker_paths(r.tree.package):
            out.line(f"  worker path hooked: {', '.join(r.worker_paths) or 'none'}")
        for message in r.recovered:
            out.line(f"recovered: {message}", fg="yellow")
        for s in r.superseded:
            out.line(f"  record {s.record.id}: superseded, {s.reason}; the next apply or revert drops it", fg="yellow")
        recorded = {i for rec in r.records for i in rec.patch_ids}
        for p in r.patches:
            mark = " (recorded)" if p.patch.id in recorded else ""
            colour = {"applied": "green", "applicable": None, "drifted": "red"}.get(p.state_name, "yellow")
            shown = f"{p.revision_text}: `rlprobe-patch apply` upgrades it" if p.outdated else p.state_name
            out.line(f"  {p.patch.id:<28} {shown}{mark}", fg=colour)
            for text in (p.skipped, p.native, *p.reasons):
                if text:
                    out.line(f"      {text}")
        print_notices(out, r.patches)
    if prune:
        for g in pruned:
            out.line(f"{g['package']} at {g['root']}: gone, dropped from the registry", fg="yellow")
    else:
        roots.print_gone(out)
    return int(ExitCode.OK)


# -- forget -----------------------------------------------------------------------------------
@click.command("forget")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@command
def forget_cmd(out: Out, paths: tuple[Path, ...]) -> int:
    """Drop trees (deleted, moved) from the registry that argument-less commands use; nothing else changes."""
    from rlprobe_patch.state_registry import forget_trees, registered_trees

    wanted = {str(p.expanduser().absolute()) for p in paths}
    # A root, or its package folder (as --verl-root accepts both).
    matches = [e for e in registered_trees() if {e["root"], str(Path(e["root"]) / e["package"])} & wanted]
    if not matches:
        raise RefusedError(
            f"not registered: {', '.join(sorted(wanted))}", hint="`rlprobe-patch status` lists the registered trees"
        )
    dropped = forget_trees(matches)
    named = {e["root"] for e in dropped} | {str(Path(e["root"]) / e["package"]) for e in dropped}
    unknown = sorted(w for w in wanted if w not in named)
    out.emit({"ok": True, "forgotten": dropped, "not_registered": unknown})
    for e in dropped:
        still = Path(e["root"], e["package"]).is_dir()
        note = " (the tree is still there: its record is kept; name it with its root option)" if still else ""
        out.line(f"forgot {e['package']} at {e['root']}{note}")
    for w in unknown:
        out.line(f"not registered: {w}", fg="yellow")
    return int(ExitCode.OK)


# -- list -------------------------------------------------------------------------------------
@click.command("list")
@command
def list_cmd(out: Out) -> int:
    """Every patch in the catalogue: releases, backends and why."""
    from rlprobe_patch.catalogue import load_catalogue

    patches = load_catalogue()
    out.emit(
        {
            "ok": True,
            "patches": [
                {
                    "id": p.id,
                    "revision": p.revision,
                    "package": p.package,
                    "sites": [
                        {"target": t.target, "versions": str(t.versions), "required": t.required} for t in p.sites
                    ],
                    "backends": list(p.backends),
                    "modes": list(p.modes),
                    "versions": str(p.versions),
                    "tested": list(p.tested),
                    "why": p.why,
                }
                for p in patches
            ],
        }
    )
    for p in patches:
        modes = f"; modes {', '.join(p.modes)}" if p.modes else ""
        out.line(f"{p.id}  ({p.package} {p.versions}; backends {', '.join(p.backends)}{modes})", bold=True)
        for site in p.sites:
            extra = "" if site.required else ", when present"
            out.line(f"  edits:  {site.target} ({p.package} {site.versions}{extra})")
        out.line(f"  tested: {', '.join(p.tested)}")
        out.line(f"  why:    {p.why}")
    return int(ExitCode.OK)


# -- demo -------------------------------------------------------------------------------------
@click.command("demo")
@click.option(
    "--verl-version",
    default=lambda: max(releases("verl").tested, key=Version),
    show_default="the newest tested release",
    help="Release fetched from the package index.",
)
@click.option("--offline", is_flag=True, help="Use the bundled fixture tree instead of downloading.")
@click.option("--workdir", type=click.Path(path_type=Path), help="Scratch folder (default: a new temp folder).")
@click.option(
    "--consistency",
    is_flag=True,
    help="Instead: the consistency chain end to end on the CPU (verl's FSDP engine and SGLang's patched forward "
    "dump the same tiny model; check-dump --compare pairs them by request id; a flipped weight must disagree).",
)
@click.option(
    "--python",
    metavar="PATH",
    help="With --consistency: a venv's python with CPU torch, verl and msprobe (default: one built once in the cache).",
)
@command
def demo_cmd(
    out: Out, verl_version: str, offline: bool, workdir: Path | None, consistency: bool, python: str | None
) -> int:
    """Fetch a real verl release into a scratch folder; apply, verify, diff stat, revert, prove identity."""
    from rlprobe_patch.demo import run_demo
    from rlprobe_patch.workflow.cli import WorkflowUsageError

    if consistency:
        from rlprobe_patch.demo_consistency import run_consistency_demo

        if offline:
            raise WorkflowUsageError("--offline does not go with --consistency (it needs verl, SGLang and msprobe)")
        result = run_consistency_demo(python=python, workdir=workdir, say=out.line, progress=out.progress)
        out.emit(result)
        return int(ExitCode.OK if result["ok"] else ExitCode.VERIFY_FAILED)
    if python:
        raise WorkflowUsageError("--python goes with --consistency")
    report = run_demo(verl_version, offline=offline, workdir=workdir, say=out.line, progress=out.progress)
    out.emit({"ok": report["identical"] and report["verified"], **report})
    return int(ExitCode.OK if report["identical"] and report["verified"] else ExitCode.VERIFY_FAILED)
