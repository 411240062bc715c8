"""`rlprobe-patch matrix`: the compatibility matrix, run on the real releases (see matrix.py)."""

from __future__ import annotations

from pathlib import Path

import click

from rlprobe_patch.cli_base import Out, command
from rlprobe_patch.errors import ExitCode


@click.command("matrix")
@click.option("--patch", "patch_ids", multiple=True, metavar="ID", help="Only this patch's cells (repeatable).")
@click.option("--release", "releases", multiple=True, metavar="VERSION", help="Only this release (repeatable).")
@click.option("--cache", type=click.Path(path_type=Path), help="Wheel cache (default: the test suite's).")
@click.option("--write-readme", is_flag=True, help="Write the table between the matrix markers of --readme.")
@click.option("--readme", type=click.Path(path_type=Path), default=Path("README.md"), show_default=True)
@command
def matrix_cmd(
    out: Out,
    patch_ids: tuple[str, ...],
    releases: tuple[str, ...],
    cache: Path | None,
    write_readme: bool,
    readme: Path,
) -> int:
    """Run every patch x release cell the catalogue claims on real wheels; print the markdown table."""
    from rlprobe_patch.matrix import FAILING, markdown, run_matrix
    from rlprobe_patch.matrix import write_readme as write

    cells = run_matrix(patch_ids, releases, cache, progress=out.progress)
    table = markdown(cells)
    failing = [c for c in cells if c.outcome == FAILING]
    if write_readme:
        write(readme, table)
    out.emit({"ok": not failing, "cells": [c.to_json() for c in cells], "table": table})
    out.line(table.rstrip())
    if write_readme:
        out.line(f"written: {readme}", fg="green")
    return int(ExitCode.VERIFY_FAILED if failing else ExitCode.OK)
