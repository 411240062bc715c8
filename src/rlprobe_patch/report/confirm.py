"""The runs that would confirm a diagnosed cause: the user's consistency script with one setting changed.

The settings are release data (`patches/releases/verl.toml` `[[diagnosis_confirm]]`). A line is a command,
`rlprobe-patch script RUN.sh --mode consistency --set KEY=VALUE -o OUT`, on the launch script the report was
given (`--replay-script`), and it is printed only where that run differs from a plain consistency script of
RUN.sh in exactly that setting:

- a setting the consistency derivation itself sets (`enforce_eager=True`, the prefix cache off on vLLM, ...)
  is dropped: a plain consistency script already runs it (or the `--set` would be overridden);
- a setting RUN.sh already has at that value is dropped: nothing would change;
- a sampling setting the step's capture recorded at that value (`logprobs_mode=processed_logprobs` where the
  capture says the rollout ran with it) is dropped: the run already had it.

Without a launch script there is no run to name: no line (the report's "next" says how to get them).

What a plain consistency script of RUN.sh sets is the collection workflow's to say (`workflow.derive`, which the
report does not import): the caller of `report.make.make_report` passes its answer in as a function
(`ConsistencyOf`), asked once per report.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlprobe_patch.catalogue.releases import releases

ROLLOUT = "actor_rollout_ref.rollout."

# (the keys a plain consistency script of a launch script sets, the values the launch script runs with for the
# keys asked): `workflow.derive.consistency_settings`; None where no consistency script can be derived from it
ConsistencySettings = tuple[frozenset[str], dict[str, Any]]
ConsistencyOf = Callable[[str, frozenset[str]], "ConsistencySettings | None"]


def confirming_keys() -> frozenset[str]:
    """The keys of the settings a confirming run changes (release data)."""
    return frozenset(c.set.partition("=")[0] for c in releases("verl").confirms)


def confirm_lines(
    cause: str, script: str | None, plain: ConsistencySettings | None, sampling: dict[str, Any] | None = None
) -> tuple[str, ...]:
    """The one-setting-changed runs for `cause` on `script` (the report's --replay-script), where `plain` says what
    a consistency script of it sets (None: none can be derived, no run to name); `sampling` is the rollout settings
    of the step that shows the cause (its capture's, else the launch script's)."""
    if script is None or plain is None:
        return ()
    owned, current = plain
    lines = []
    for c in releases("verl").confirms:
        if c.cause != cause:
            continue
        key, _, value = c.set.partition("=")
        if key in owned or _same(current.get(key), value) or _recorded(sampling, key, value):
            continue
        output = Path(script).with_name(f"{Path(script).stem}.confirm-{key.rsplit('.', 1)[-1]}.sh")
        command = ["rlprobe-patch", "script", script, "--mode", "consistency", "--set", c.set, "-o", str(output)]
        lines.append(f"{shlex.join(command)}  # verl {c.versions}: {c.why}")
    return tuple(lines)


def _same(have: Any, wanted: str) -> bool:
    """Whether a setting's value is `wanted` (as Hydra reads the override's text)."""
    if have is None:
        return False
    try:
        return float(have) == float(wanted)
    except (TypeError, ValueError):
        return str(have).lower() == wanted.lower()


def _recorded(sampling: dict[str, Any] | None, key: str, value: str) -> bool:
    """Whether the step's recorded sampling settings already have `key` at `value`."""
    if not sampling or not key.startswith(ROLLOUT):
        return False
    return _same(sampling.get(key.removeprefix(ROLLOUT)), value)


def sampling_of(steps: list[dict[str, Any]], cause: str) -> dict[str, Any] | None:
    """The rollout settings of the step that shows `cause` best (its score, then its fit), as the diagnosis'
    steps hold them (`diagnosis.steps[].sampling`)."""
    best: tuple[float, float] | None = None
    sampling = None
    for step in steps:
        for c in step["causes"]:
            if c["cause"] == cause and (best is None or (c["score"], c["fit"]) > best):
                best, sampling = (c["score"], c["fit"]), step.get("sampling")
    return sampling
