"""A training script as what it configures: its launch, environment and settings, each with its source.

`launch.script.read_script` fills a `Script` from a verl launch (Hydra overrides, YAML files,
the tree's config); `launch.slime_args` fills one from a slime launch (argparse flags).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlprobe_patch.launch import hydra_compose
from rlprobe_patch.launch.commands import Launch
from rlprobe_patch.launch.shell import Field, Reading

TRUE_WORDS = {"true", "1", "yes", "on"}


@dataclass
class Override:
    prefix: str  # "", "+", "++" or "~"
    key: str
    value: Any
    value_text: str
    field: Field

    @property
    def line(self) -> int:
        return self.field.line

    @property
    def source(self) -> str:
        return arg_source(self.field)

    def to_json(self) -> dict[str, Any]:
        return {"prefix": self.prefix, "key": self.key, "value": self.value, "source": self.source}


@dataclass
class Setting:
    key: str
    value: Any
    source: str  # "run.sh:12", "verl default (ppo_trainer.yaml)", "/path/to/file.yaml", "--env"
    override: Override | None = None

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "value": self.value, "source": self.source}


@dataclass
class YamlFile:
    path: Path
    reason: str  # how the script refers to it
    loaded: bool
    error: str = ""


@dataclass(frozen=True)
class RunPath:
    """A path the launch names relative to the folder it runs in (its entry point file, its config folder)."""

    what: str  # "the entry point", "the config folder"
    path: Path  # as named from the folder the script was read in (absolute)
    source: str  # where it was written: "run.sh:18"


@dataclass
class Script:
    path: Path
    text: str
    reading: Reading
    launch: Launch | None = None  # the verl launch (the last one the script runs)
    env: dict[str, Setting] = field(default_factory=dict)  # what the launch's process sees
    overrides: list[Override] = field(default_factory=list)
    yaml_files: list[YamlFile] = field(default_factory=list)
    settings: dict[str, Setting] = field(default_factory=dict)
    config_path: str | None = None
    config_name: str | None = None
    composed: hydra_compose.Composed | None = None
    yaml_data: list[tuple[Path, Any]] = field(default_factory=list, repr=False)  # in load order
    framework: str = "verl"  # "verl", or "slime" (`python3 train.py`: `slime_args` reads its flags)
    flags: list[Any] = field(default_factory=list)  # slime: every `--flag` with its values, in order
    # what the launch names relative to the folder it runs in and that is not there (read_script)
    missing_in_cwd: list[RunPath] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # how it was read where that is not what was asked
    cwd_hint: str = ""  # what it names relative to the folder it runs in, found nowhere: name that folder

    @property
    def facts(self) -> dict[str, hydra_compose.Fact]:
        return self.composed.facts if self.composed is not None else {}

    @property
    def unresolved(self) -> list[str]:
        return [str(u) for u in self.reading.unresolved]

    def fact(self, name: str, default: Any = None) -> Any:
        found = self.facts.get(name)
        return default if found is None else found.value

    def get(self, key: str) -> Setting | None:
        """The setting named `key`, or the one whose dotted key ends with `.key` (the longest match)."""
        if key in self.settings:
            return self.settings[key]
        found = self.find(key)
        return found[0] if found else None

    def find(self, suffix: str) -> list[Setting]:
        tail = "." + suffix
        return [s for k, s in self.settings.items() if k == suffix or k.endswith(tail)]

    def value(self, key: str, default: Any = None) -> Any:
        setting = self.get(key)
        return default if setting is None else setting.value

    def code_text(self) -> str:
        """The script and the files it sources, without comments (for the skill's text signals on code)."""
        return "\n".join(self.reading.code)

    def overrides_of(self, key: str) -> list[Override]:
        return [o for o in self.overrides if o.key == key]


def arg_source(f: Field) -> str:
    """Where a word came from: its file and line, or the option that gave it (--arg, --env, --set)."""
    if f.file.name in ("--arg", "--env", "--set"):
        return f.file.name
    return f.source


def is_true(value: Any) -> bool:
    return value is True or (isinstance(value, str) and value.strip().lower() in TRUE_WORDS) or value == 1
