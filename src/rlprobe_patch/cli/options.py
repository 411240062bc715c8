"""Every option that two commands or more take, defined once (pip's `cmdoptions`).

- `tree_options`: which trees a command acts on, collected into one `Roots` argument;
- `apply_options`: what `apply` and `cluster apply` patch;
- `reader_options`: how a launch script is read (`--arg`, `--env`);
- `python_option`, `verl_root_option`, `lock_timeout_option`: single options shared as they are.

Only click and light modules are imported here (`--help` loads every command module). The option
groups whose choices come from the catalogue (`tree_options`, `apply_options`) import it when a
command module that takes them is imported, so that a command without them (`report`, `config`,
`doctor`) never loads the catalogue, the record folder or gitdb.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from rlprobe_patch.cli.paths import CheckedPath

if TYPE_CHECKING:
    from rlprobe_patch.launch.script import ReaderOptions

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def _stack(options: list[Decorator], fn: Callable[..., Any]) -> Callable[..., Any]:
    """Apply `options` so that `--help` lists them in the order given."""
    for option in reversed(options):
        fn = option(fn)
    return fn


python_option = click.option(
    "--python",
    "python",
    metavar="PATH",
    help="The training environment's interpreter (default: this one); the trees it imports are found "
    "without importing them.",
)
verl_root_option = click.option(
    "--verl-root",
    type=click.Path(path_type=Path),
    help="The verl tree whose config the script's values are composed with (default: the one --python imports).",
)
cwd_option = click.option(
    "--cwd",
    type=CheckedPath("dir"),
    help="The directory the script is run from (default: this one): its relative paths, `cd`s and the "
    "YAMLs' relative hydra.searchpath resolve against it.",
)
lock_timeout_option = click.option(
    "--lock-timeout", type=float, default=10.0, show_default=True, help="Seconds to wait for another run."
)


# -- the trees ----------------------------------------------------------------------------------
def _root_option(package: str, option: str) -> Decorator:
    return click.option(
        option,
        f"{package}_root",
        type=click.Path(path_type=Path),
        help=f"Directory containing the `{package}` package (a checkout or site-packages); the package folder "
        "also works.",
    )


trust_record_option = click.option(
    "--trust-record",
    is_flag=True,
    help="Use a tree's .rlprobe-patch record even when another user owns it (like git's safe.directory; "
    "its content is checked all the same).",
)


def tree_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--python, --trust-record and a root option per package; the command gets `roots: Roots`."""
    from rlprobe_patch.catalogue.trees import ROOT_OPTIONS
    from rlprobe_patch.core.roots import Roots

    @functools.wraps(fn)
    def wrapper(*args: Any, python: str | None, trust_record: bool, **kwargs: Any) -> Any:
        given = {package: kwargs.pop(f"{package}_root") for package in ROOT_OPTIONS}
        roots = Roots({p: root for p, root in given.items() if root is not None}, python, trust_record)
        return fn(*args, roots=roots, **kwargs)

    roots_options = [_root_option(package, option) for package, option in ROOT_OPTIONS.items()]
    return _stack([python_option, trust_record_option, *roots_options], wrapper)


# -- what apply patches ---------------------------------------------------------------------------
def _apply_options_list() -> list[Decorator]:
    from rlprobe_patch.catalogue.trees import BACKENDS, PATCH_MODES, WORKER_IMPLS

    return [
        click.option("--backend", type=click.Choice(BACKENDS), help="Training backend to hook (needed for verl)."),
        click.option(
            "--mode",
            type=click.Choice(PATCH_MODES),
            help="Apply the whole patch set of a collection mode (consistency: engine hook, PROMPTS_ONLY trimming, "
            "guards, request id, and the SGLang / vLLM-Ascend patches; inference: SGLang without native msprobe). "
            "Without it: the backend's engine hook, and the patches of the SGLang / vLLM-Ascend trees named.",
        ),
        click.option("--only", metavar="ID[,ID]", help="Apply just these patches (ids from `rlprobe-patch list`)."),
        click.option("--skip", metavar="ID[,ID]", help="Leave these patches out of the set."),
        click.option("--dry-run", is_flag=True, help="Plan and show what would change (the diff); write nothing."),
        click.option(
            "--force", is_flag=True, help="Allow a release outside the patch's version range (anchors still checked)."
        ),
        click.option(
            "--worker-impl",
            type=click.Choice(WORKER_IMPLS),
            default="auto",
            show_default=True,
            help="verl's worker path to hook: the engine workers or the legacy fsdp/megatron workers. auto: the one "
            "the release runs the PPO actor through (0.6.x legacy; 0.7.x trainer.use_legacy_worker_impl, read from "
            "--script; 0.8+ engine).",
        ),
        click.option(
            "--script",
            type=CheckedPath("file"),
            help="The training script, to read which worker path it uses (on a cluster: the same path on every node).",
        ),
        click.option("--msprobe-config", metavar="PATH", help="Default msprobe config.json baked into the verl hooks."),
        click.option("--sglang-config", metavar="PATH", help="Default msprobe config.json baked into the SGLang hook."),
    ]


def apply_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The options of `apply` that `cluster apply` passes on to every node."""
    return _stack(_apply_options_list(), fn)


# -- how a launch script is read --------------------------------------------------------------------
def _env_pairs(values: tuple[str, ...]) -> dict[str, str]:
    pairs = {}
    for item in values:
        key, eq, value = item.partition("=")
        if not eq or not key.isidentifier():
            raise click.BadParameter(f"{item!r}: expected KEY=VALUE", param_hint="--env")
        pairs[key] = value
    return pairs


READER_OPTIONS: list[Decorator] = [
    click.option(
        "--arg",
        "script_args",
        multiple=True,
        metavar="VALUE",
        help='An argument the script is run with ("$@", $1, ...); repeatable, in order.',
    ),
    click.option(
        "--env",
        "script_env",
        multiple=True,
        metavar="KEY=VALUE",
        help="A variable set when the script is run (INFER_BACKEND=sglang bash run.sh); repeatable.",
    ),
]


def reader_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`--arg VALUE` ("$@" of the script) and `--env KEY=VALUE` (its environment), both repeatable."""
    return _stack(READER_OPTIONS, fn)


def read_options(opts: dict[str, Any], **given: Any) -> ReaderOptions:
    """How the command reads a launch script: `--arg` and `--env`, taken out of its options, and the `given`
    fields of `ReaderOptions` (verl_root, cwd, python, ...)."""
    from rlprobe_patch.launch.script import ReaderOptions  # the reader (bash, Hydra) only where a command reads

    args, env = tuple(opts.pop("script_args", ())), _env_pairs(opts.pop("script_env", ()))
    return ReaderOptions(args=args, env=env, **given)
