"""What every command shares: output (text or one JSON document), and errors to exit codes.

Only click and light modules are imported here: the engine (LibCST, GitPython) is imported
inside the commands that use it, so that `--version`, `--help` and usage errors start fast; the
catalogue and the roots only where a helper needs them (`report` uses neither).
"""

from __future__ import annotations

import functools
import json
import sys
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from rlprobe_patch.base.errors import ExitCode, PatchError
from rlprobe_patch.cli.paths import check_path_options, os_error

if TYPE_CHECKING:
    from rlprobe_patch.catalogue.trees import Tree
    from rlprobe_patch.core.plan import PatchPlan
    from rlprobe_patch.core.roots import Roots
    from rlprobe_patch.core.skill_checks import SkillReport


class Out:
    """Human output (colour on a terminal) or one JSON document on stdout."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def line(self, text: str = "", **style: Any) -> None:
        if not self.as_json:
            click.secho(text, **style)

    def progress(self, text: str) -> None:
        if not self.as_json:
            click.secho(f"... {text}", err=True, dim=True)

    def emit(self, data: dict[str, Any], indent: int | None = 2) -> None:
        """The command's one JSON document; every command's has `ok` (a document without it is a bug)."""
        if "ok" not in data:
            raise AssertionError(f"a --json document without ok: {sorted(data)}")
        if self.as_json:
            click.echo(json.dumps(data, indent=indent, default=str))

    def emit_encoded(self, text: str) -> None:
        """A JSON document already encoded (on one line), `ok` its first key."""
        if not text.startswith('{"ok": '):
            raise AssertionError(f"a --json document without ok first: {text[:40]}")
        if self.as_json:
            click.echo(text)


def command(fn: Callable[..., int]) -> Callable[..., None]:
    """Turn PatchError into its message and exit code; never exit 0 after a failure."""

    @click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of text.")
    @functools.wraps(fn)
    def wrapper(as_json: bool, **kwargs: Any) -> None:
        out = Out(as_json)
        try:
            try:
                check_path_options(kwargs)
                code = fn(out, **kwargs)
            except OSError as exc:  # a path given that cannot be read or written: a refusal, not a bug
                refusal = os_error(exc)
                if refusal is None:
                    raise
                raise refusal from exc
        except PatchError as exc:
            code = int(exc.exit_code)
            if as_json:
                out.emit({"ok": False, **exc.to_json()})
            else:
                click.secho(f"error: {exc.message}", fg="red", err=True)
                for detail in exc.details:
                    click.echo(f"  - {detail}", err=True)
                if exc.hint:
                    click.echo(f"hint: {exc.hint}", err=True)
        except Exception as exc:  # a bug: say so plainly, with the traceback
            code = int(ExitCode.INTERNAL)
            if as_json:
                out.emit({"ok": False, "error": "InternalError", "message": repr(exc), "exit_code": code})
            else:
                traceback.print_exc()
                click.secho(f"internal error: {exc!r} (please report it)", fg="red", err=True)
        sys.exit(code)

    return wrapper


def parse_ids(text: str | None) -> tuple[str, ...]:
    return tuple(part.strip() for part in (text or "").split(",") if part.strip())


def print_gone(out: Out, roots: Roots) -> None:
    """The registered trees a command found gone, and how to drop them."""
    from rlprobe_patch.core.roots import GONE_HINT

    for g in roots.gone:
        out.line(f"{g['package']} at {g['root']}: gone ({g['reason']})", fg="yellow")
    if roots.gone:
        out.line(f"hint: {GONE_HINT}", fg="yellow")


def print_tree(out: Out, tree: Tree) -> None:
    out.line(f"{tree.package} {tree.version} at {tree.root} (version from {tree.version_source})", bold=True)


def print_notices(out: Out, plans: list[PatchPlan]) -> None:
    for p in plans:
        for notice in p.notices:
            out.line(f"notice ({p.patch.id}): {notice}", fg="yellow")
        for warning in p.warnings:
            out.line(f"WARNING ({p.patch.id}): {warning}", fg="red", bold=True)


def skill_report(report: SkillReport, as_json: bool) -> None:
    """Print a skill checker's report as the skill does, or as one JSON document; exit 0 PASS, 1 FAIL."""
    document = report.to_json()
    if as_json:
        click.echo(json.dumps(document, indent=2))
    else:
        for line in document["lines"]:
            click.echo(line)
    sys.exit(document["exit_code"])
