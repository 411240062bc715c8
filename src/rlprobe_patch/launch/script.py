"""A training script read as what it configures: the launch, its environment, verl's final values.

`read_script(path)` evaluates the script the way bash would (`shell.read_shell`: arrays,
defaults, functions, sourced files, `"$@"` from `--arg`, `--env`), finds the verl launch among
the commands it runs (`commands.launches`), and reads that launch's Hydra overrides. With a verl
tree, the overrides are composed with the tree's own config by Hydra (`hydra_compose`), so every
setting is the value verl will run with; without one, the YAML files the script names and the
overrides are read as Hydra would layer them, and the facts fall back to the release defaults in
the catalogue, marked as assumed. Every setting keeps where it came from.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rlprobe_patch.base.errors import RefusedError
from rlprobe_patch.catalogue.trees import Tree
from rlprobe_patch.launch import hydra_compose, slime_args
from rlprobe_patch.launch.commands import Launch, launches
from rlprobe_patch.launch.model import Override, RunPath, Script, Setting, YamlFile, arg_source
from rlprobe_patch.launch.shell import Field, read_shell

_OVERRIDE = re.compile(r"^(~|\+\+|\+)?([A-Za-z_][\w\-]*(?:[./@][\w\-]+)*)(?:=(.*))?$", re.S)
_YAML_PATH = re.compile(r"[^\s=:'\"]+\.ya?ml$")
_CONFIG_OPTIONS = {
    "--config-path": "config_path",
    "-cp": "config_path",
    "--config-name": "config_name",
    "-cn": "config_name",
}


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


@dataclass(frozen=True)
class ReaderOptions:
    """How a launch script is read: what bash would be given, and the tree its overrides are composed with. The
    options `detect`, `script`, `check-script`, `apply --script`, `verify --script` and `report --replay-script`
    share, passed as one value through `read_script`, `workflow.detect.detect_script` and `workflow.derive.derive`."""

    args: tuple[str, ...] = ()  # the script's own arguments, "$@" (`--arg`)
    env: Mapping[str, str] = field(default_factory=dict)  # the caller's environment (`--env`)
    verl_root: Path | None = None  # the verl tree whose config Hydra composes the overrides with
    release: str | None = None  # that tree's release (its defaults)
    extra: tuple[str, ...] = ()  # overrides added after the launch's own (`script --set`)
    cwd: Path | None = None  # the directory the script runs from (default: this process's)
    python: str | None = None  # the interpreter that answers its import probes


def read_script(path: Path, options: ReaderOptions = ReaderOptions()) -> Script:
    """Read `path` as bash and Hydra would, with `options` (`ReaderOptions`).

    Without `options.cwd`, a launch that names its entry point or its config folder relative to the folder it
    runs in (`python3 main_ppo_split.py`, `--config-path=$(pwd)/examples/...`) where they are not is read
    as run from the folder of or above the script that holds them, and `Script.notes` says which."""
    path = Path(path)
    cwd, verl_root = options.cwd, options.verl_root

    def read(folder: Path | None) -> Script:
        return _read_script(path, replace(options, cwd=folder))

    script = read(cwd)
    start = (cwd or Path.cwd()).absolute()
    folder = _run_folder(path, start, script.missing_in_cwd) if cwd is None and script.missing_in_cwd else None
    if folder is not None:  # what verl does run from there, Hydra's errors included
        there = read(folder)
        there.notes.append(_assumed_folder_note(path, start, folder, script.missing_in_cwd))
        return there
    if script.missing_in_cwd:
        named = _named(script.missing_in_cwd, start)
        where = f"--cwd {start}" if cwd is not None else f"{start}, nor in a folder of or above the script"
        script.cwd_hint = (
            f"the script names {named} relative to the folder it runs in: not found from {where}; "
            "say where it runs with --cwd DIR"
        )
        script.notes.append(script.cwd_hint)
    composed = script.composed
    if cwd is not None or verl_root is None or composed is None or not composed.errors:
        return script
    checkout = _checkout_of(path, verl_root)
    if checkout is None or checkout == start:
        return script
    # run from elsewhere, verl's examples name their config relative to the checkout they run from
    there = read(checkout)
    if there.composed is None or there.composed.errors:
        return script
    there.notes.append(
        f"read as run from the verl checkout holding --verl-root and the script ({checkout}): run from "
        f"{start}, Hydra cannot compose it ({composed.errors[0]}). verl reads it the same way only "
        f"when run from there: cd {checkout} before the launch (or say where it runs with --cwd DIR)"
    )
    return there


def _run_folder(path: Path, start: Path, missing: list[RunPath]) -> Path | None:
    """The nearest folder of or above the script (other than `start`) that holds every path the launch
    names relative to `start`; None when there is none, or a path is not relative to `start`."""
    relative = []
    for item in missing:
        if not item.path.is_relative_to(start):
            return None
        relative.append(item.path.relative_to(start))
    script_folder = Path(os.path.normpath(path.absolute().parent))
    for folder in (script_folder, *script_folder.parents):
        if folder != start and all((folder / rel).exists() for rel in relative):
            return folder
    return None


def _named(missing: list[RunPath], start: Path) -> str:
    return ", ".join(
        f"{m.what} {m.path.relative_to(start) if m.path.is_relative_to(start) else m.path} ({m.source})"
        for m in missing
    )


def _assumed_folder_note(path: Path, start: Path, folder: Path, missing: list[RunPath]) -> str:
    own = folder == Path(os.path.normpath(path.absolute().parent))
    holder = "the script's own folder" if own else "a folder above the script"
    return (
        f"read as run from {folder}: the script names {_named(missing, start)} relative to the folder it runs in, "
        f"not found from {start}; {holder} holds {'it' if len(missing) == 1 else 'them'}. It runs the same way "
        f"only from there: cd {folder} before the launch (or say where it runs with --cwd DIR)"
    )


def _checkout_of(path: Path, verl_root: Path) -> Path | None:
    """The nearest folder above the script whose `verl/` is the package of `verl_root` (the checkout the
    script belongs to), None when there is none."""
    try:
        package = (verl_root / "verl").resolve(strict=True)
    except OSError:
        return None
    for folder in path.absolute().parents:
        candidate = folder / "verl"
        if candidate.is_dir() and candidate.resolve() == package:
            return folder
    return None


def _read_script(path: Path, options: ReaderOptions) -> Script:
    cwd, extra = options.cwd, options.extra
    reading = read_shell(
        path,
        args=list(options.args),
        env=dict(options.env),
        cwd=cwd.absolute() if cwd is not None else None,
        python=options.python,
    )
    text = path.read_text(encoding="utf-8")
    script = Script(path=path, text=text, reading=reading)
    found = launches(reading)
    verl = [launch for launch in found if launch.is_verl]
    if not verl:
        slime = [launch for launch in found if slime_args.is_slime(launch)]
        if slime:
            launch = slime[-1]
            launch.args = [*launch.args, *(Field(f"--{text.lstrip('-')}", Path("--set"), 0) for text in extra)]
            slime_args.read_slime(script, launch)
            return script
        commands = ", ".join(sorted({Path(r.argv[0].text).name for r in reading.runs if r.argv})) or "none"
        raise RefusedError(
            f"{path}: no verl launch found, nor a slime one (commands it runs: {commands})",
            hint="the script must run verl (python3 -m verl.trainer.main_ppo key=value ...) or slime "
            "(python3 train.py --flag value ...); "
            "pass the script's own arguments with --arg and its environment with --env",
        )
    launch = script.launch = verl[-1]
    launch.args = [*launch.args, *(Field(text, Path("--set"), 0) for text in extra)]
    for name, value in launch.env.items():
        script.env[name] = Setting(name, value.text, arg_source(value))
    script.overrides = _overrides_of(script, launch.args)
    hydra_args = [_hydra_arg(f) for f in launch.args]
    script.missing_in_cwd = _missing_in_cwd(launch, hydra_args)
    cwd = launch.run.cwd
    if options.verl_root is not None:
        script.composed = hydra_compose.compose_launch(
            options.verl_root, launch.entry, hydra_args, cwd=cwd, release=options.release
        )
        if script.composed.config is not None:
            _settle_composed(script)
            return script
    _load_yaml(script)
    _settle(script)
    if script.composed is None:
        script.composed = hydra_compose.compose_launch(None, launch.entry, hydra_args, cwd=cwd, release=options.release)
        _facts_from_settings(script)
    return script


def _missing_in_cwd(launch: Launch, hydra_args: list[hydra_compose.Arg]) -> list[RunPath]:
    """What the launch names relative to the folder it runs in that is not there: a file entry point
    outside the verl package (`python3 main_ppo_split.py`; one inside it is read from the tree's) and an
    absolute `--config-path` (as `$(pwd)/examples/...` gives; a relative one is relative to the entry
    point's file, as Hydra reads it)."""
    missing = []
    if not launch.module and "verl" not in Path(launch.entry).parts:
        entry = Path(os.path.normpath(launch.run.cwd / launch.entry))
        if not entry.is_file():
            missing.append(RunPath("the entry point", entry, launch.source))
    config_path = hydra_compose.parse_hydra_args(hydra_args).config_path
    if config_path is not None and os.path.isabs(config_path.text) and not Path(config_path.text).is_dir():
        missing.append(RunPath("the config folder", Path(os.path.normpath(config_path.text)), config_path.source))
    return missing


def read_run_facts(script: Path, tree: Tree, options: ReaderOptions = ReaderOptions()) -> dict[str, tuple[Any, str]]:
    """{fact: (value, source)} of the run `script` launches, composed with this tree's own config
    (what `core.rules` calls `RunFacts`).

    The script is read as bash and Hydra read it (arrays, sourced files, `--env`, `--arg`): the values
    are the ones the package will run with, defaults included."""
    found = read_script(script, replace(options, verl_root=tree.root, release=str(tree.version)))
    composed = found.composed
    if composed is not None and composed.errors:
        raise RefusedError(f"--script {script}: {tree.package} would refuse its overrides", details=composed.errors)
    return {name: (fact.value, fact.source) for name, fact in found.facts.items()}


def _facts_from_settings(script: Script) -> None:
    """Without a tree: what the YAML files and overrides set wins over the assumed release defaults."""
    assert script.composed is not None
    facts = script.composed.facts
    for fact, keys in hydra_compose.FACT_KEYS.items():
        for key in keys:
            setting = script.settings.get(key)
            if setting is not None:
                facts[fact] = hydra_compose.Fact(setting.value, setting.source)
                break
    engine = script.settings.get("model_engine")
    if engine is not None:
        facts["train_backend"] = hydra_compose.Fact("fsdp" if engine.value == "dp" else engine.value, engine.source)


UNRESOLVED = "__unresolved__"


def _hydra_arg(f: Field) -> hydra_compose.Arg:
    """The argument as Hydra gets it; a value only a run knows (`$(date)`) stands as UNRESOLVED."""
    if f.exact:
        return hydra_compose.Arg(f.text, arg_source(f))
    key, eq, _ = f.text.partition("=")
    if eq and _OVERRIDE.match(key + "=x"):
        return hydra_compose.Arg(f"{key}={UNRESOLVED}", arg_source(f) + " (value not known before the run)")
    return hydra_compose.Arg(f.text, arg_source(f))


def _overrides_of(script: Script, args: list[Field]) -> list[Override]:
    found: list[Override] = []
    skip_next = False
    for position, word in enumerate(args):
        if skip_next:
            skip_next = False
            continue
        text = word.text
        if text in _CONFIG_OPTIONS:
            skip_next = True
            if position + 1 < len(args):
                setattr(script, _CONFIG_OPTIONS[text], args[position + 1].text)
            continue
        if text.startswith("-"):
            if "=" in text and text.split("=", 1)[0] in _CONFIG_OPTIONS:
                option, option_value = text.split("=", 1)
                setattr(script, _CONFIG_OPTIONS[option], option_value)
            continue
        m = _OVERRIDE.match(text)
        if not m or (m.group(3) is None and m.group(1) != "~"):
            continue
        value_text = m.group(3) or ""
        value = None if m.group(1) == "~" else parse_value(value_text)
        found.append(Override(m.group(1) or "", m.group(2), value, value_text, word))
    return found


def _settle_composed(script: Script) -> None:
    """Every key of the composed config, with the last override that set it (or its parent)."""
    from omegaconf import OmegaConf

    composed = script.composed
    assert composed is not None and composed.config is not None
    with hydra_compose.grammar_parsed_once():
        try:
            data = OmegaConf.to_container(composed.config, resolve=True)
        except Exception:  # an interpolation only verl's own resolvers answer: resolve key by key
            data = _resolved_by_key(composed.config)
    default = f"verl default ({composed.config_file})"
    settings = {key: Setting(key, value, default) for key, value in flatten(data).items()}
    # each key under its parents ("a.b.c" under "a" and "a.b"): an override sets its key and everything below
    below: dict[str, list[Setting]] = {}
    for name, setting in settings.items():
        below.setdefault(name, []).append(setting)
        for dot in (i for i, char in enumerate(name) if char == "."):
            below.setdefault(name[:dot], []).append(setting)
    for override in script.overrides:
        key = override.key.split("@")[0] if "@" in override.key else override.key
        for setting in below.get(key, ()):
            setting.source = override.source
            setting.override = override
    script.settings = settings


def _resolved_by_key(config: Any, prefix: str = "") -> Any:
    """The config as plain data, each value resolved where it can be and kept as written where not."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(config, DictConfig):
        out: dict[str, Any] = {}
        for key in config.keys():
            path = f"{prefix}.{key!s}" if prefix else str(key)
            try:
                node = config[key]
            except Exception:
                out[str(key)] = str(config._get_node(key)._value())  # type: ignore[union-attr]
                continue
            out[str(key)] = _resolved_by_key(node, path) if isinstance(node, DictConfig | ListConfig) else node
        return out
    try:
        return OmegaConf.to_container(config, resolve=True)
    except Exception:
        return OmegaConf.to_container(config, resolve=False)


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
    for run in script.reading.runs:
        for word in run.argv:
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
            settings[key] = Setting(key, value, str(path))
    for override in script.overrides:
        if override.prefix == "~":
            for key in [k for k in settings if k == override.key or k.startswith(override.key + ".")]:
                del settings[key]
            continue
        source = override.source
        for key in [k for k in settings if k.startswith(override.key + ".")]:
            del settings[key]  # a dict value replaces the whole subtree
        settings[override.key] = Setting(override.key, override.value, source, override)
        for key, value in flatten(override.value, override.key).items():
            settings[key] = Setting(key, value, source, override)
    script.settings = settings
