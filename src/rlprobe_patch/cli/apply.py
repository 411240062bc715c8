"""`rlprobe-patch apply`: patch the trees named (or found), each change a recorded, revertible diff."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import click

from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.catalogue.trees import ROOT_OPTIONS
from rlprobe_patch.cli.options import apply_options, lock_timeout_option, read_options, reader_options, tree_options
from rlprobe_patch.cli.output import Out, command, parse_ids, print_notices, print_tree
from rlprobe_patch.core.roots import Roots


@click.command("apply")
@tree_options
@apply_options
@reader_options
@click.option(
    "--merge",
    is_flag=True,
    help="Upgrading a patch applied at an older revision: keep edits made to its files since (three-way merge) "
    "instead of stopping.",
)
@lock_timeout_option
@command
def apply_cmd(
    out: Out,
    roots: Roots,
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
    **reader: Any,
) -> int:
    """Patch verl (engine of BACKEND, or a mode's set), SGLang and vLLM-Ascend; each change a revertible diff."""
    from rlprobe_patch.base.diffs import diffstat
    from rlprobe_patch.core.apply import apply
    from rlprobe_patch.core.plan import Plan, plan_apply, raise_if_refused
    from rlprobe_patch.core.selection import select_trees, wants_trainer
    from rlprobe_patch.launch.script import read_run_facts

    only_ids, skip_ids = parse_ids(only), parse_ids(skip)
    trees = roots.for_apply(mode, wants_trainer(mode, only_ids), only_ids)
    params = {k: v for k, v in (("msprobe_config", msprobe_config), ("sglang_config", sglang_config)) if v}
    reading = read_options(dict(reader))
    chosen = select_trees(
        trees,
        backend=backend,
        mode=mode,
        only=only_ids,
        skip=skip_ids,
        worker_impl=worker_impl,
        script=script,
        read_facts=(lambda tree: read_run_facts(script, tree, **reading)) if script is not None else None,
    )
    worker_paths = {c.tree.root: c.worker_path for c in chosen if c.worker_path}
    trust_record = roots.trust_record
    plans: dict[Path, Plan] = {}
    if len(chosen) > 1 and not dry_run:
        for c in chosen:  # refuse everything before writing anything
            out.progress(f"planning {c.tree.package} {c.tree.version} at {c.tree.root}")
            plans[c.tree.root] = plan_apply(c.tree, c.selection, params, force, merge=merge, trust_record=trust_record)
            raise_if_refused(plans[c.tree.root])
    results = [
        (
            c.tree,
            apply(
                c.tree,
                c.selection,
                params,
                force=force,
                dry_run=dry_run,
                merge=merge,
                lock_timeout=lock_timeout,
                progress=out.progress,
                plan=plans.get(c.tree.root),
                trust_record=trust_record,
            ),
        )
        for c in chosen
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
    # verify and revert of the trees this run patched (not every registered tree): the commands to run next
    named = [word for tree, _ in results for word in (ROOT_OPTIONS[tree.package], str(tree.root))]
    named += ["--trust-record"] if roots.trust_record else []
    follow = None
    if not dry_run and any(r.record for _, r in results):
        follow = {"verify": ["rlprobe-patch", "verify", *named], "revert": ["rlprobe-patch", "revert", *named]}
    # "trees" is the full answer; the first tree's fields are repeated at the top for one-tree scripts.
    out.emit({"ok": True, **documents[0], "trees": documents, "notes": roots.notes, "next": follow})
    for note in roots.notes:
        out.line(f"note: {note}", fg="yellow")
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
    if follow is not None:
        out.line(f"next: {shlex.join(follow['verify'])}  # undo: {shlex.join(follow['revert'])}")
    return int(ExitCode.OK)
