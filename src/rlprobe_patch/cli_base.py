"""What every command shares: output (text or one JSON document), errors to exit codes, tree options.

Only click and light modules are imported here: the engine (LibCST, GitPython) is imported
inside the commands that use it, so that `--version`, `--help` and usage errors start fast.
"""

from __future__ import annotations

import functools
import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from rlprobe_patch.errors import ExitCode, PatchError, RefusedError
from rlprobe_patch.trees import PACKAGES, ROOT_OPTIONS, TRAINERS, Tree, find_tree, importable

if TYPE_CHECKING:
    from rlprobe_patch.plan import PatchPlan


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

    def emit(self, data: dict[str, Any]) -> None:
        if self.as_json:
            click.echo(json.dumps(data, indent=2, default=str))


def command(fn: Callable[..., int]) -> Callable[..., None]:
    """Turn PatchError into its message and exit code; never exit 0 after a failure."""

    @click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of text.")
    @functools.wraps(fn)
    def wrapper(as_json: bool, **kwargs: Any) -> None:
        out = Out(as_json)
        try:
            code = fn(out, **kwargs)
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


# Root options of packages added after the first three (trees.ROOT_OPTIONS): they reach `Roots`
# through the click context, so that no command's signature has to name each package.
_MORE_ROOTS = "rlprobe_patch.more_roots"


def more_roots() -> dict[str, Path]:
    """The roots given for packages after the first three (`--slime-root`), by package."""
    context = click.get_current_context(silent=True)
    return dict(context.meta.get(_MORE_ROOTS, {})) if context is not None else {}


def _keep_root(ctx: click.Context, param: click.Parameter, value: Path | None) -> None:
    if value is not None:
        assert param.name is not None
        ctx.meta.setdefault(_MORE_ROOTS, {})[param.name.removesuffix("_root")] = value


def tree_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--verl-root / --sglang-root / --vllm-ascend-root / --slime-root / --python, for every tree command."""
    for package, name in reversed([(p, o) for p, o in ROOT_OPTIONS.items() if p not in _FIRST_ROOTS]):
        fn = click.option(
            name,
            type=click.Path(path_type=Path),
            expose_value=False,
            callback=_keep_root,
            help=f"Directory containing the `{package}` package (a source checkout); the package folder also works.",
        )(fn)
    for name, package in (("--vllm-ascend-root", "vllm_ascend"), ("--sglang-root", "sglang"), ("--verl-root", "verl")):
        fn = click.option(
            name,
            type=click.Path(path_type=Path),
            help=f"Directory containing the `{package}` package (e.g. site-packages); the package folder also works.",
        )(fn)
    fn = click.option(
        "--trust-record",
        is_flag=True,
        help="Use a tree's .rlprobe-patch record even when another user owns it (like git's safe.directory; "
        "its content is checked all the same).",
    )(fn)
    return click.option(
        "--python",
        "python",
        metavar="PATH",
        help="The training environment's interpreter: the trees it imports (found without importing them).",
    )(fn)


_FIRST_ROOTS = ("verl", "sglang", "vllm_ascend")  # named in every command's signature


class Roots:
    """The trees a command acts on: the roots given, else the trees `python` imports."""

    def __init__(
        self, verl_root: Path | None, sglang_root: Path | None, vllm_ascend_root: Path | None, python: str | None
    ) -> None:
        self.given = {
            package: root
            for package, root in (("verl", verl_root), ("sglang", sglang_root), ("vllm_ascend", vllm_ascend_root))
            if root is not None
        }
        self.given.update(more_roots())
        self.python = python
        self.gone: list[dict[str, str]] = []  # registered trees that no longer exist: root, package, reason

    def for_apply(self, mode: str | None, needs_verl: bool) -> list[Tree]:
        if self.given:  # exactly the trees named, nothing searched
            return [find_tree(package, root) for package, root in self.given.items()]
        trees = self._trainers() if needs_verl or mode == "consistency" else []
        if mode in ("inference", "consistency"):
            trees += [find_tree(p, None, self.python) for p in ("sglang", "vllm_ascend") if importable(p, self.python)]
        if not trees:
            raise RefusedError(
                "no tree to patch: nothing importable for this mode",
                hint="name the trees with --verl-root / --sglang-root / --vllm-ascend-root",
            )
        return trees

    def _trainers(self) -> list[Tree]:
        """The RL frameworks `python` imports (verl, slime); verl's refusal when it imports none."""
        found = [find_tree(p, None, self.python) for p in TRAINERS if p != "verl" and importable(p, self.python)]
        if not found or importable("verl", self.python):
            found.insert(0, find_tree("verl", None, self.python))
        return found

    def for_records(self, all_gone_ok: bool = False) -> list[Tree]:
        """Trees named, or found through --python, or else every tree apply registered that still
        exists; registered trees that are gone are kept in `self.gone` (refused when all are gone)."""
        if self.given:
            return [find_tree(package, root) for package, root in self.given.items()]
        if self.python is not None:
            others = [p for p in PACKAGES if p not in TRAINERS and importable(p, self.python)]
            return self._trainers() + [find_tree(p, None, self.python) for p in others]
        from rlprobe_patch.state_registry import registered_trees

        entries = registered_trees()
        if not entries:
            raise RefusedError(
                "no patched tree is registered",
                hint="pass --verl-root DIR (or --sglang-root, --vllm-ascend-root, --python PATH) to name the tree",
            )
        found = []
        for entry in entries:
            try:
                found.append(find_tree(entry["package"], Path(entry["root"])))
            except RefusedError as exc:
                self.gone.append({**entry, "reason": exc.message})
        if not found and not all_gone_ok:
            raise RefusedError(
                f"every registered tree is gone: {'; '.join(g['reason'] for g in self.gone)}",
                hint=GONE_HINT,
            )
        return found

    def print_gone(self, out: Out) -> None:
        for g in self.gone:
            out.line(f"{g['package']} at {g['root']}: gone ({g['reason']})", fg="yellow")
        if self.gone:
            out.line(f"hint: {GONE_HINT}", fg="yellow")


GONE_HINT = (
    "a registered tree moved or was deleted: name it with --verl-root (or the package's root option); "
    "`rlprobe-patch forget PATH` or `rlprobe-patch status --prune` drops it from the registry"
)


def parse_ids(text: str | None) -> tuple[str, ...]:
    return tuple(part.strip() for part in (text or "").split(",") if part.strip())


def print_tree(out: Out, tree: Tree) -> None:
    out.line(f"{tree.package} {tree.version} at {tree.root} (version from {tree.version_source})", bold=True)


def print_notices(out: Out, plans: list[PatchPlan]) -> None:
    for p in plans:
        for notice in p.notices:
            out.line(f"notice ({p.patch.id}): {notice}", fg="yellow")
        for warning in p.warnings:
            out.line(f"WARNING ({p.patch.id}): {warning}", fg="red", bold=True)


def skill_report(ok: bool, lines: list[str], as_json: bool) -> None:
    """Print a skill checker's lines as the skill does, or as one JSON document; exit 0 PASS, 1 FAIL."""
    code = 0 if ok else 1
    if as_json:
        checks: list[dict[str, Any]] = []
        for line in lines:
            word, sep, rest = line.partition(": ")
            if sep and word in ("PASS", "FAIL", "INFO"):
                checks.append({"status": word, "subject": rest, "errors": []})
            elif line.startswith("  - ") and checks:
                checks[-1]["errors"].append(line[4:])
        click.echo(json.dumps({"ok": ok, "exit_code": code, "checks": checks, "lines": lines}, indent=2))
    else:
        for line in lines:
            click.echo(line)
    sys.exit(code)
