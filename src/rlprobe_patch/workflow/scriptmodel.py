"""A training script read as what it configures: environment, Hydra overrides, YAML files.

`read_script(path)` walks the script's commands in order, expanding variables from earlier
assignments (`MODEL=${1:-Qwen}`, `export DUMP_ON=1`), finds the training command (the one
that carries Hydra overrides), parses each override (`key=value`, `+key=`, `++key=`, `~key`,
quoted values, lists, inline dicts) and loads the YAML files the script names
(`--config-path/--config-name` with their `defaults`, and any `*.yaml` path it mentions).
The result is one table of effective settings, each with where it came from: YAML first,
then the command line, a later override winning over an earlier one, as in Hydra.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlprobe_patch.errors import RefusedError
from rlprobe_patch.workflow.shell import Command, Comment, Word, tokenize

_OVERRIDE = re.compile(r"^(~|\+\+|\+)?([A-Za-z_][\w\-]*(?:[./@][\w\-]+)*)(?:=(.*))?$", re.S)
# A command that runs a verl entry point (or any python file/module) with overrides.
_PROGRAM = re.compile(r"(^|/)(python[\d.]*|torchrun|accelerate|deepspeed)$|\.py$")
_YAML_PATH = re.compile(r"[^\s=:'\"]+\.ya?ml$")
_CONFIG_OPTIONS = {
    "--config-path": "config_path",
    "-cp": "config_path",
    "--config-name": "config_name",
    "-cn": "config_name",
}
TRUE_WORDS = {"true", "1", "yes", "on"}


@dataclass
class Override:
    prefix: str  # "", "+", "++" or "~"
    key: str
    value: Any
    value_text: str
    word: Word
    command: int  # index into Script.commands

    @property
    def line(self) -> int:
        return self.word.line

    def to_json(self) -> dict[str, Any]:
        return {"prefix": self.prefix, "key": self.key, "value": self.value, "line": self.line}


@dataclass
class Setting:
    key: str
    value: Any
    source: str  # "script:12", "yaml:path/to/file.yaml", "env:12"
    override: Override | None = None

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "value": self.value, "source": self.source}


@dataclass
class YamlFile:
    path: Path
    reason: str  # how the script refers to it
    loaded: bool
    error: str = ""


@dataclass
class Script:
    path: Path
    text: str
    commands: list[Command]
    comments: list[Comment]
    variables: dict[str, str] = field(default_factory=dict)
    env: dict[str, Setting] = field(default_factory=dict)  # exported / command-prefix variables
    overrides: list[Override] = field(default_factory=list)
    training_commands: list[int] = field(default_factory=list)
    yaml_files: list[YamlFile] = field(default_factory=list)
    settings: dict[str, Setting] = field(default_factory=dict)
    config_path: str | None = None
    config_name: str | None = None
    unresolved: dict[str, int] = field(default_factory=dict)  # variable -> first line used
    yaml_data: list[tuple[Path, Any]] = field(default_factory=list, repr=False)  # in load order

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
        """The script without its comments (for the skill's text signals on code)."""
        return "\n".join(" ".join(w.text for w in c.words) for c in self.commands)

    def overrides_of(self, key: str) -> list[Override]:
        return [o for o in self.overrides if o.key == key]


def parse_value(text: str) -> Any:
    """A Hydra override value as Python: null, booleans, numbers, lists, dicts, strings."""
    if text == "":
        return ""
    candidate = text
    if candidate.startswith("{"):
        candidate = re.sub(r"([{,]\s*[A-Za-z_][\w.\-]*):(?=\S)", r"\1: ", candidate)
    if "${" in candidate:  # an interpolation stays a string
        return text
    import yaml  # only scripts with Hydra values pay for it

    try:
        value = yaml.safe_load(candidate)
    except yaml.YAMLError:
        return text
    if isinstance(value, str | int | float | bool | list | dict) or value is None:
        return value
    return text  # dates and other YAML types: keep the text


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(data, dict) and data:
        for key, value in data.items():
            full = f"{prefix}.{key}" if prefix else str(key)
            out[full] = value
            if isinstance(value, dict):
                out.update(flatten(value, full))
    return out


def read_script(path: Path, text: str | None = None) -> Script:
    path = Path(path)
    if text is None:
        if not path.is_file():
            raise RefusedError(f"{path}: no such file", hint="pass the training script (e.g. run_qwen_grpo.sh)")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise RefusedError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    commands, comments = tokenize(text)
    script = Script(path=path, text=text, commands=commands, comments=comments)
    _walk(script)
    _load_yaml(script)
    _settle(script)
    return script


def _walk(script: Script) -> None:
    variables = script.variables
    for index, command in enumerate(script.commands):
        for word in command.words:
            word.expand(variables)
            for name in word.unresolved:
                script.unresolved.setdefault(name, word.line)
        assignments = command.assignments
        args = command.args
        if not args:  # plain assignments: shell variables
            for name, word in assignments:
                variables[name] = word.text.split("=", 1)[1]
            continue
        first = args[0].text
        if first in ("export", "declare", "local", "readonly"):
            for word in args[1:]:
                m = re.match(r"^([A-Za-z_]\w*)=(.*)$", word.text, re.S)
                if m:
                    variables[m.group(1)] = m.group(2)
                    script.env[m.group(1)] = Setting(m.group(1), m.group(2), f"script:{word.line}")
                elif re.match(r"^[A-Za-z_]\w*$", word.text) and word.text in variables:
                    name = word.text
                    script.env[name] = Setting(name, variables[name], f"script:{word.line}")
            continue
        if first == "unset":
            for word in args[1:]:
                variables.pop(word.text, None)
                script.env.pop(word.text, None)
            continue
        overrides = _overrides_of(script, index, args)
        is_training = bool(overrides) and any(_PROGRAM.search(w.text) or w.text == "-m" for w in args[:4])
        if is_training:
            script.training_commands.append(index)
            script.overrides.extend(overrides)
            for name, word in assignments:  # `DUMP_ON=1 python3 -m ...`
                script.env[name] = Setting(name, word.text.split("=", 1)[1], f"script:{word.line}")


def _overrides_of(script: Script, index: int, args: list[Word]) -> list[Override]:
    found: list[Override] = []
    skip_next = False
    for position, word in enumerate(args):
        if position == 0 or skip_next:
            skip_next = False
            continue
        text = word.text
        if text in ("-m",) or text in _CONFIG_OPTIONS:
            skip_next = True
            if text in _CONFIG_OPTIONS and position + 1 < len(args):
                setattr(script, _CONFIG_OPTIONS[text], args[position + 1].text)
            continue
        if text.startswith("-"):
            if "=" in text and text.split("=", 1)[0] in _CONFIG_OPTIONS:
                option, value = text.split("=", 1)
                setattr(script, _CONFIG_OPTIONS[option], value)
            continue
        m = _OVERRIDE.match(text)
        if not m or (m.group(3) is None and m.group(1) != "~"):
            continue
        value_text = m.group(3) or ""
        value = None if m.group(1) == "~" else parse_value(value_text)
        found.append(Override(m.group(1) or "", m.group(2), value, value_text, word, index))
    return found


def _load_yaml(script: Script) -> None:
    base = script.path.parent
    seen: set[Path] = set()

    def resolve(name: str) -> Path | None:
        candidate = Path(name).expanduser()
        for option in [candidate] if candidate.is_absolute() else [base / candidate, Path.cwd() / candidate]:
            if option.is_file():
                return option.resolve()
        return None

    def load(path: Path, reason: str, follow_defaults: bool) -> None:
        import yaml

        if path in seen:
            return
        seen.add(path)
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            script.yaml_files.append(YamlFile(path, reason, False, str(exc).splitlines()[0]))
            return
        if follow_defaults and isinstance(data, dict):
            for entry in data.get("defaults") or []:
                name = entry if isinstance(entry, str) else None
                if name and name != "_self_":
                    target = path.parent / f"{name}.yaml"
                    if target.is_file():
                        load(target.resolve(), f"defaults of {path.name}", True)
        script.yaml_files.append(YamlFile(path, reason, True))
        script.yaml_data.append((path, data))

    if script.config_name:
        config_dir = Path(script.config_path or ".")
        if not config_dir.is_absolute():
            config_dir = base / config_dir
        name = script.config_name if script.config_name.endswith((".yaml", ".yml")) else script.config_name + ".yaml"
        target = config_dir / name
        if target.is_file():
            load(target.resolve(), f"--config-name {script.config_name}", True)
        else:
            script.yaml_files.append(YamlFile(target, f"--config-name {script.config_name}", False, "not found"))
    for command in script.commands:
        for word in command.words:
            value = word.text.split("=", 1)[-1]
            if _YAML_PATH.search(value):
                found = resolve(value)
                if found is not None:
                    load(found, f"named on line {word.line}", False)
                elif not any(y.path.name == Path(value).name for y in script.yaml_files):
                    script.yaml_files.append(YamlFile(Path(value), f"named on line {word.line}", False, "not found"))


def _settle(script: Script) -> None:
    settings: dict[str, Setting] = {}
    for path, data in script.yaml_data:
        for key, value in flatten(data).items():
            if key == "defaults" or key.startswith("defaults."):
                continue
            settings[key] = Setting(key, value, f"yaml:{path}")
    for override in script.overrides:
        if override.prefix == "~":
            for key in [k for k in settings if k == override.key or k.startswith(override.key + ".")]:
                del settings[key]
            continue
        source = f"script:{override.line}"
        for key in [k for k in settings if k.startswith(override.key + ".")]:
            del settings[key]  # a dict value replaces the whole subtree
        settings[override.key] = Setting(override.key, override.value, source, override)
        for key, value in flatten(override.value, override.key).items():
            settings[key] = Setting(key, value, source, override)
    script.settings = settings


def is_true(value: Any) -> bool:
    return value is True or (isinstance(value, str) and value.strip().lower() in TRUE_WORDS) or value == 1
