"""The `rlprobe-patch` entry point: one registry of commands, each module loaded when it is used.

The CLI is the top layer: a command module parses its options (`options.py`, each defined once),
calls the layers below (`core`, `workflow`, `cluster`, `demo`, `matrix`) and renders what they
return (`output.py`). Command modules import `output` and `options`, never this module; the engine
behind a command (LibCST, GitPython, Ray, Hydra) is imported inside it, so that `--version`,
`--help` and usage errors start fast.
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any

import click

from rlprobe_patch import __version__

__all__ = ["COMMANDS", "CommandRegistry", "main"]

# name -> "module:attribute" of its click command.
COMMANDS: dict[str, str] = {
    "apply": "rlprobe_patch.cli.apply:apply_cmd",
    "verify": "rlprobe_patch.cli.verify:verify_cmd",
    "status": "rlprobe_patch.cli.status:status_cmd",
    "revert": "rlprobe_patch.cli.revert:revert_cmd",
    "forget": "rlprobe_patch.cli.status:forget_cmd",
    "list": "rlprobe_patch.cli.catalogue:list_cmd",
    "demo": "rlprobe_patch.cli.demo:demo_cmd",
    "check-engine-patch": "rlprobe_patch.cli.skill:check_engine_patch_cmd",
    "check-consistency-patch": "rlprobe_patch.cli.skill:check_consistency_patch_cmd",
    "detect": "rlprobe_patch.cli.detect:detect_cmd",
    "doctor": "rlprobe_patch.cli.doctor:doctor_cmd",
    "config": "rlprobe_patch.cli.config:config_cmd",
    "script": "rlprobe_patch.cli.script:script_cmd",
    "check-script": "rlprobe_patch.cli.script:check_script_cmd",
    "check-dump": "rlprobe_patch.cli.check_dump:check_dump_cmd",
    "report": "rlprobe_patch.cli.report:report_cmd",
    "matrix": "rlprobe_patch.cli.matrix:matrix_cmd",
    "cluster": "rlprobe_patch.cli.cluster:cluster",
}


class CommandRegistry(click.Group):
    """A click group whose commands are named in `COMMANDS` and imported on first use
    (click's own extension points: `list_commands` imports nothing, `get_command` one module)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, _, attr = COMMANDS[cmd_name].partition(":")
        command = getattr(importlib.import_module(module), attr)
        assert isinstance(command, click.Command), command
        return command

    def main(  # type: ignore[override]  # click's overloads on standalone_mode; this takes both
        self,
        args: list[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        """As click's, but a usage error click finds itself (an unknown option, a missing argument) is one JSON
        document on stdout with `ok` when `--json` was asked for, as every error a command raises is."""
        argv = list(sys.argv[1:] if args is None else args)
        if not standalone_mode or "--json" not in argv:
            return super().main(argv, prog_name, complete_var, standalone_mode, **extra)
        try:
            return super().main(argv, prog_name, complete_var, False, **extra)
        except click.ClickException as exc:
            document = {"ok": False, "error": "UsageError", "message": exc.format_message(), "exit_code": exc.exit_code}
            click.echo(json.dumps(document, indent=2))
            sys.exit(exc.exit_code)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)


@click.group(cls=CommandRegistry, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rlprobe-patch")
def main() -> None:
    """Versioned, verified, revertible msprobe hooks for verl training stacks."""


if __name__ == "__main__":
    main()
