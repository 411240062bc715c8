"""slime launches: what `detect`, `script` and `check-script` read from `python3 train.py ...`.

slime (THUDM/slime) is launched as `python3 train.py` or `python3 train_async.py`, usually
through `ray job submit ... -- python3 train.py ...`, with its arguments gathered in bash arrays
(`PERF_ARGS=(...)`, `"${PERF_ARGS[@]}"`) and a model file sourced from `scripts/models/`. The
launch is found and its words expanded by the shell reader (`shell`, `commands`); here the words
are read the way slime's argparse reads them: `--flag value...` (every word up to the next
`--flag`), `--flag=value`, a flag with no value is a switch that is on; the last occurrence wins.
Each setting keeps the file and line its flag was written on.

What a collection script for slime sets is derived in `workflow.derive.slime`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlprobe_patch.launch.commands import Launch
from rlprobe_patch.launch.hydra_compose import Composed, Fact
from rlprobe_patch.launch.model import Script, Setting, arg_source
from rlprobe_patch.launch.shell import Field

ENTRIES = ("train.py", "train_async.py")
_NUMBER = re.compile(r"^-\d")

# Facts read from slime's flags: (fact, flag, default when the script does not set it, whose default).
FACT_FLAGS: tuple[tuple[str, str, Any, str], ...] = (
    ("train_backend", "train-backend", "megatron", "slime"),
    ("actor_tp", "tensor-model-parallel-size", 1, "Megatron"),
    ("actor_pp", "pipeline-model-parallel-size", 1, "Megatron"),
    ("actor_cp", "context-parallel-size", 1, "Megatron"),
    ("actor_ep", "expert-model-parallel-size", 1, "Megatron"),
    ("rollout_tp", "rollout-num-gpus-per-engine", 1, "slime"),
    ("nnodes", "actor-num-nodes", 1, "slime"),
    ("n_gpus_per_node", "actor-num-gpus-per-node", 8, "slime"),
    ("micro_batch_size", "micro-batch-size", 1, "slime"),
    ("dynamic_batch", "use-dynamic-batch-size", False, "slime"),
    ("colocate", "colocate", False, "slime"),
    ("rollout_batch_size", "rollout-batch-size", None, "slime"),
    ("n_samples_per_prompt", "n-samples-per-prompt", 1, "slime"),
    ("global_batch_size", "global-batch-size", None, "slime"),
    ("num_rollout", "num-rollout", None, "slime"),
)


def is_slime(launch: Launch) -> bool:
    """slime's own entry points, started by Python itself (slime's ray actors make the other processes)."""
    started_by = set(launch.launcher) - {"ray job submit", "env", "nohup", "exec", "time", "setsid", "stdbuf"}
    python = bool(started_by) and all(re.search(r"^python[\d.]*$", name) for name in started_by)
    return not launch.module and Path(launch.entry).name in ENTRIES and python


@dataclass
class Flag:
    """One `--flag` of the command line: its word and the words of its values."""

    name: str  # without the leading dashes
    word: Field
    values: list[Field] = field(default_factory=list)

    @property
    def value(self) -> Any:
        if not self.values:
            return True
        if len(self.values) == 1:
            return self.values[0].text
        return [v.text for v in self.values]

    @property
    def exact(self) -> bool:
        return all(v.exact for v in self.values)

    @property
    def source(self) -> str:
        where = arg_source(self.word)
        return where if self.exact else f"{where}, value not known before the run"


def parse_flags(args: list[Field]) -> list[Flag]:
    """argparse's reading of slime's argv: every word after `--flag` up to the next flag is its value."""
    flags: list[Flag] = []
    for word in args:
        text = word.text
        if text.startswith("--") and len(text) > 2 and not _NUMBER.match(text):
            name, eq, value = text[2:].partition("=")
            flags.append(Flag(name, word, [Field(value, word.file, word.line, word.unresolved)] if eq else []))
        elif flags:
            flags[-1].values.append(word)
    return flags


def read_slime(script: Script, launch: Launch) -> None:
    """Fill `script` from a slime launch: settings keyed by flag name (last occurrence wins), facts."""
    script.framework = "slime"
    script.launch = launch
    for name, value in launch.env.items():
        script.env[name] = Setting(name, value.text, arg_source(value))
    script.flags = parse_flags(launch.args)
    for flag in script.flags:
        script.settings[flag.name] = Setting(flag.name, flag.value, flag.source)
    facts: dict[str, Fact] = {}
    for fact, name, default, whose in FACT_FLAGS:
        setting = script.settings.get(name)
        if setting is not None:
            facts[fact] = Fact(setting.value, setting.source)
        elif default is not None:
            facts[fact] = Fact(default, f"{whose} default (not set)")
    facts["rollout_backend"] = Fact("sglang", f"slime rolls out with SGLang ({launch.source})")
    facts["entry"] = Fact(Path(launch.entry).name, launch.source)
    script.composed = Composed(config=None, facts=facts, config_file="slime arguments")


def flag_occurrences(script: Script, name: str) -> list[Flag]:
    return [f for f in script.flags if f.name == name]
