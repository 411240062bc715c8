"""`rlprobe-patch script`'s work: the collection script derived from a launch script, and what it writes.

`derive_collection` reads the launch script (`derive.derive`), refuses what no option can make collectable, names
the msprobe configs it will write beside the collection script where none was given, and renders the collection
script and, in consistency mode, its log-prob capture run; `write_collection` writes them, each refused before
anything is written where it exists (unless `force`). The CLI parses the options and prints the `Collection`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rlprobe_patch.base.errors import RefusedError
from rlprobe_patch.launch.script import ReaderOptions
from rlprobe_patch.workflow.config import SIDES, config_beside, write_side_config
from rlprobe_patch.workflow.derive import (
    Change,
    CollectOptions,
    Requirements,
    capture_output,
    capture_run,
    check_given_configs,
    default_output,
    derive,
    refuse_blocked,
    refuse_underivable,
    render_script,
    write_script,
)
from rlprobe_patch.workflow.detect import Detection

_CONFIG_SIDES = ("actor", "generate", "training")  # in the order the configs are named to the derivation


@dataclass
class Capture:
    """The consistency collection's second run, the log-prob capture for `report` (the dump run cannot capture)."""

    req: Requirements
    path: Path
    text: str
    changes: list[Change]


@dataclass
class Collection:
    """A collection script derived from `original`, and what `script` writes beside it."""

    original: Path
    output: Path
    detection: Detection
    req: Requirements
    text: str
    changes: list[Change]
    capture: Capture | None
    missing: list[str]  # the sides whose msprobe config is written beside the collection script
    # the configs written (side -> output, msprobe's check, why unchecked), once `write_collection` ran
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)


def derive_collection(
    original: Path,
    mode: str | None,
    reader: ReaderOptions,
    collect: CollectOptions,
    hint: str,
    output: Path | None,
    invocation: list[str],
) -> Collection:
    """The collection script of `original` (written to `output`, else the default name beside it); `invocation` is
    the command as given, for the rerun a refusal names."""
    check_given_configs(collect.configs, reader.cwd)
    detection, req, verl_root = derive(original, mode, reader, collect, hint)
    refuse_blocked(original, req)
    output = output or default_output(original, req.mode)
    # the msprobe configs neither given nor named by the script: written beside the collection script
    missing = [side for side in SIDES[req.mode] if side not in req.configs]
    if missing:
        named = {**collect.configs, **{side: str(config_beside(output, side)) for side in missing}}
        configs = {side: named[side] for side in _CONFIG_SIDES if side in named}
        detection, req, verl_root = derive(original, mode, reader, replace(collect, configs=configs), hint)
    refuse_underivable(original, req, invocation, reader.extra)
    text, changes = render_script(detection.script, req, original.name, composed=verl_root is not None)
    capture = None
    capture_req = capture_run(detection.script, req)
    if capture_req is not None:
        capture_text, capture_changes = render_script(
            detection.script, capture_req, original.name, verl_root is not None
        )
        capture = Capture(capture_req, capture_output(output), capture_text, capture_changes)
    return Collection(original, output, detection, req, text, changes, capture, missing)


def write_collection(collection: Collection, force: bool, python: str | None) -> None:
    """The collection script, its capture run and the configs it names, each refused before anything is written
    where it exists (unless `force`)."""
    c, capture = collection, collection.capture
    if capture is not None and capture.path.exists() and not force:  # refused before either is written
        write_script(c.original, capture.path, capture.text, force)
    for side in c.missing:
        path = config_beside(c.output, side)
        if path.exists() and not force:
            raise RefusedError(f"{path} exists", hint=f"pass --force to replace it, or give --{side}-config")
    for side in c.missing:
        checked, why = write_side_config(c.req.mode, side, c.output, python, c.req.rollout_backend)
        c.configs[side] = {"output": str(config_beside(c.output, side)), "msprobe_check": checked, "unchecked": why}
    write_script(c.original, c.output, c.text, force)
    if capture is not None:
        write_script(c.original, capture.path, capture.text, force)
