"""How a launch script is read: the options every command that reads one shares."""

from __future__ import annotations

from typing import Any

import click


def _env_pairs(values: tuple[str, ...]) -> dict[str, str]:
    pairs = {}
    for item in values:
        key, eq, value = item.partition("=")
        if not eq or not key.isidentifier():
            raise click.BadParameter(f"{item!r}: expected KEY=VALUE", param_hint="--env")
        pairs[key] = value
    return pairs


def reader_options(fn: Any) -> Any:
    """`--arg VALUE` ("$@" of the script) and `--env KEY=VALUE` (its environment), both repeatable."""
    options = [
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
    for option in reversed(options):
        fn = option(fn)
    return fn


def read_options(opts: dict[str, Any]) -> dict[str, Any]:
    """The reader's keyword arguments (`args`, `env`), taken out of a command's options."""
    return {"args": list(opts.pop("script_args", ())), "env": _env_pairs(opts.pop("script_env", ()))}
