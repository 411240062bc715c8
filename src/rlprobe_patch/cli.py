"""The `rlprobe-patch` entry point: one registry of commands, assembled here and loaded when used.

Command modules import `cli_base` (output, errors, tree options), never this module, so there
is no import circle; a command's module (and the engine behind it: LibCST, GitPython, Ray,
Hydra) is imported only when that command runs or `--help` lists it.
"""

from __future__ import annotations

import importlib
from collections.abc import ItemsView, Iterator, KeysView, ValuesView
from typing import Any

import click

from rlprobe_patch import __version__
from rlprobe_patch.cli_base import GONE_HINT, Out, Roots, command, tree_options

__all__ = ["COMMANDS", "GONE_HINT", "Out", "Roots", "command", "main", "tree_options"]

# name -> "module:attribute" of its click command.
COMMANDS: dict[str, str] = {
    "apply": "rlprobe_patch.patch_cli:apply_cmd",
    "verify": "rlprobe_patch.patch_cli:verify_cmd",
    "status": "rlprobe_patch.patch_cli:status_cmd",
    "revert": "rlprobe_patch.patch_cli:revert_cmd",
    "forget": "rlprobe_patch.patch_cli:forget_cmd",
    "list": "rlprobe_patch.patch_cli:list_cmd",
    "demo": "rlprobe_patch.patch_cli:demo_cmd",
    "check-engine-patch": "rlprobe_patch.patch_cli:check_engine_patch_cmd",
    "check-consistency-patch": "rlprobe_patch.patch_cli:check_consistency_patch_cmd",
    "detect": "rlprobe_patch.workflow.cli:detect_cmd",
    "doctor": "rlprobe_patch.workflow.cli:doctor_cmd",
    "config": "rlprobe_patch.workflow.cli:config_cmd",
    "script": "rlprobe_patch.workflow.cli:script_cmd",
    "check-script": "rlprobe_patch.workflow.cli:check_script_cmd",
    "check-dump": "rlprobe_patch.workflow.cli:check_dump_cmd",
    "matrix": "rlprobe_patch.matrix_cli:matrix_cmd",
    "cluster": "rlprobe_patch.cluster:cluster",
}


class LazyCommands(dict[str, click.Command]):
    """`Group.commands` whose entries are imported from `registry` ("module:attribute") when read.

    Listing the names imports nothing; reading a command (or every command, as `--help` and
    `items()` do) imports its module once."""

    def __init__(self, registry: dict[str, str]) -> None:
        super().__init__()
        self.registry = dict(registry)

    def _load(self, name: str) -> None:
        if name in self.registry and not dict.__contains__(self, name):
            module, _, attr = self.registry[name].partition(":")
            command = getattr(importlib.import_module(module), attr)
            assert isinstance(command, click.Command), command
            dict.__setitem__(self, name, command)

    def _load_all(self) -> None:
        for name in self.registry:
            self._load(name)

    def __getitem__(self, name: str) -> click.Command:
        self._load(name)
        return dict.__getitem__(self, name)

    def get(self, name: str, default: Any = None) -> Any:
        self._load(name)
        return dict.get(self, name, default)

    def __contains__(self, name: object) -> bool:
        return name in self.registry or dict.__contains__(self, name)

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys([*self.registry, *dict.keys(self)]))

    def __len__(self) -> int:
        return len(dict.fromkeys([*self.registry, *dict.keys(self)]))

    def keys(self) -> KeysView[str]:  # type: ignore[override]
        self._load_all()
        return dict.keys(self)

    def values(self) -> ValuesView[click.Command]:  # type: ignore[override]
        self._load_all()
        return dict.values(self)

    def items(self) -> ItemsView[str, click.Command]:  # type: ignore[override]
        self._load_all()
        return dict.items(self)


class CommandRegistry(click.Group):
    """A click group whose commands are named in a registry and imported on first use."""

    def __init__(self, *args: Any, registry: dict[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands = LazyCommands(registry)


@click.group(
    cls=CommandRegistry,
    registry=COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(__version__, prog_name="rlprobe-patch")
def main() -> None:
    """Versioned, verified, revertible msprobe hooks for verl training stacks."""


if __name__ == "__main__":
    main()
