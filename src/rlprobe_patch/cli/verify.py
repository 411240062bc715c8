"""`rlprobe-patch verify`: the hooks, the files and the records of every tree, and the package's own rules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.catalogue.trees import BACKENDS, PATCH_MODES
from rlprobe_patch.cli.options import read_options, reader_options, tree_options
from rlprobe_patch.cli.output import Out, command, print_gone, print_tree
from rlprobe_patch.cli.paths import CheckedPath
from rlprobe_patch.core.roots import Roots


@click.command("verify")
@tree_options
@click.option(
    "--backend", type=click.Choice(BACKENDS), help="Also check this backend's hook (default: what was applied)."
)
@click.option("--mode", type=click.Choice(PATCH_MODES), help="Also check this mode's patch set.")
@click.option(
    "--recheck",
    is_flag=True,
    help="Parse every hooked file again, also those whose bytes were already found patched by this version.",
)
@click.option(
    "--script",
    type=CheckedPath("file"),
    help="The training script: fail when the worker path its run takes is not the one hooked.",
)
@reader_options
@command
def verify_cmd(
    out: Out,
    roots: Roots,
    backend: str | None,
    mode: str | None,
    recheck: bool,
    script: Path | None,
    **reader: Any,
) -> int:
    """Check the hooks (syntax tree, compile, recorded post-image, the skill's rules)."""
    from rlprobe_patch.core.selection import Selection
    from rlprobe_patch.core.verify import verify
    from rlprobe_patch.launch.script import read_run_facts

    selection = Selection(backend or "fsdp", mode) if backend or mode else None
    trees = roots.for_records()
    reading = read_options(reader)
    results = [
        verify(
            tree,
            selection if tree.package == "verl" else None,
            {t.package: t.root for t in trees if t is not tree},
            recheck=recheck,
            run=(script, read_run_facts(script, tree, reading)) if script and tree.package == "verl" else None,
            trust_record=roots.trust_record,
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
                f"  {word}  {c.check}" + (f": {c.detail}" if c.detail and (c.warning or not c.ok) else ""),
                fg="yellow" if c.warning else (None if c.ok else "red"),
            )
    print_gone(out, roots)
    out.line("verified" if ok else "verification FAILED", fg="green" if ok else "red", bold=True)
    return int(ExitCode.OK if ok else ExitCode.VERIFY_FAILED)
