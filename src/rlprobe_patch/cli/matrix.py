"""`rlprobe-patch matrix`: the compatibility matrix, run on the real releases (see `matrix.py`)."""

from __future__ import annotations

from pathlib import Path

import click

from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.cli.output import Out, command
from rlprobe_patch.cli.paths import CheckedPath

COMPATIBILITY_PAGE = Path("docs") / "compatibility.md"


@click.command("matrix")
@click.option("--patch", "patch_ids", multiple=True, metavar="ID", help="Only this patch's cells (repeatable).")
@click.option("--release", "releases", multiple=True, metavar="VERSION", help="Only this release (repeatable).")
@click.option("--cache", type=CheckedPath("new-dir"), help="Wheel cache (default: the test suite's).")
@click.option(
    "--write-docs",
    "--write-readme",
    "write_docs",
    is_flag=True,
    help="Write the tables between the matrix and release markers of --page (--write-readme: its old name).",
)
@click.option(
    "--page",
    "--readme",
    "page",
    type=click.Path(path_type=Path),
    default=COMPATIBILITY_PAGE,
    show_default=True,
    help="The compatibility page the tables are written into (--readme: its old name).",
)
@command
def matrix_cmd(
    out: Out,
    patch_ids: tuple[str, ...],
    releases: tuple[str, ...],
    cache: Path | None,
    write_docs: bool,
    page: Path,
) -> int:
    """Run every patch x release cell the catalogue claims on real wheels; print the markdown table."""
    from rlprobe_patch.matrix import FAILING, markdown, run_matrix, write_tables

    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)  # the wheels go there: refuse now, not after a download
    cells = run_matrix(patch_ids, releases, cache, progress=out.progress)
    table = markdown(cells)
    failing = [c for c in cells if c.outcome == FAILING]
    if write_docs:
        write_tables(page, table)
    out.emit({"ok": not failing, "cells": [c.to_json() for c in cells], "table": table})
    out.line(table.rstrip())
    if write_docs:
        out.line(f"written: {page}", fg="green")
    return int(ExitCode.VERIFY_FAILED if failing else ExitCode.OK)
