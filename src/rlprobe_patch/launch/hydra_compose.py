"""Hydra decides the values: compose a launch's overrides with the verl tree's own config.

A launch is the argv a script passes to a verl entry point (`python3 -m verl.trainer.main_ppo
ARGS...`), each argument with the place it came from. With a verl tree, the arguments are
parsed by Hydra's own command-line parser (`--config-path`/`-cp`, `--config-name`/`-cn`), the
primary config is found the way `@hydra.main(config_path=..., config_name=...)` of the entry
point finds it (a relative `--config-path` is relative to the entry point's file, a relative
`file://` search path to the launch's working directory), and `hydra.compose` gives the final
config. The facts the workflow needs are read from it, each with its source: the last override
that set the key, a parent of it or the group that chose it, else the config file.

Without a tree, the facts are the release's defaults kept in `patches/releases/verl.toml`,
marked as assumed. Hydra is imported only when a tree is given.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import io
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from rlprobe_patch.catalogue.releases import releases

PPO_CONFIG_NAMES = ("ppo_trainer", "ppo_megatron_trainer")


@dataclass
class Arg:
    """One argument of the launch, as bash passes it, and where it came from ("run.sh:42")."""

    text: str
    source: str


@dataclass
class Fact:
    """A value verl will run with and its source: "run.sh:42", "verl default (ppo_trainer.yaml)",
    "assumed: verl <release> default (catalogue)"."""

    value: Any
    source: str


@dataclass
class Composed:
    """The composed config (None without a tree or when Hydra refused), the facts read from it,
    Hydra's errors with the source of the override at fault, notes, and whether facts are assumed."""

    config: Any
    facts: dict[str, Fact] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    assumed: bool = False
    ppo: bool = True  # the entry point composes a PPO trainer config (actor_rollout_ref.*)
    config_file: str = ""  # the primary config, e.g. "ppo_trainer.yaml"
    # where relative `file://` search paths were resolved when not from the launch's directory, and why
    searchpath_note: str = ""
    # relative `file://` search paths of the primary config that resolve neither from the launch's
    # directory nor from the verl checkout (the fix is the directory, not an override)
    unresolved_searchpath: list[str] = field(default_factory=list)


# verl's config nodes of the three roles (the one place these keys are spelt).
ACTOR = "actor_rollout_ref.actor"
REF = "actor_rollout_ref.ref"
ROLLOUT = "actor_rollout_ref.rollout"

# Each fact: the config keys read (first present wins) and the override keys that decide it
# besides the key itself and its parents (groups that swap the node holding it).
_ENGINE_GROUPS = ("model_engine", "actor@actor_rollout_ref.actor", "ref@actor_rollout_ref.ref")


def _engine_keys(node: str, what: str) -> tuple[str, ...]:
    """TP/PP/EP of a training engine: megatron-like sections, then torchtitan's."""
    megatron = {"tp": "tensor_model_parallel_size", "pp": "pipeline_model_parallel_size"}
    megatron["ep"] = "expert_model_parallel_size"
    titan = {"tp": "tensor_parallel_size", "pp": "pipeline_parallel_size", "ep": "expert_parallel_size"}
    return (
        f"{node}.megatron.{megatron[what]}",
        f"{node}.mindspeed.{megatron[what]}",
        f"{node}.torchtitan.{titan[what]}",
        f"{node}.veomni.{titan[what]}",
    )


FACT_KEYS: dict[str, tuple[str, ...]] = {
    "train_backend": (f"{ACTOR}.strategy",),
    "rollout_backend": (f"{ROLLOUT}.name",),
    "use_legacy_worker_impl": ("trainer.use_legacy_worker_impl",),
    "use_v1": ("trainer.use_v1",),
    "actor_tp": _engine_keys(ACTOR, "tp"),
    "actor_pp": _engine_keys(ACTOR, "pp"),
    "actor_ep": _engine_keys(ACTOR, "ep"),
    "actor_vpp": (f"{ACTOR}.megatron.virtual_pipeline_model_parallel_size",),
    "ref_tp": _engine_keys(REF, "tp"),
    "ref_pp": _engine_keys(REF, "pp"),
    "rollout_tp": (f"{ROLLOUT}.tensor_model_parallel_size",),
    "rollout_dp": (f"{ROLLOUT}.data_parallel_size",),
    "rollout_ep": (f"{ROLLOUT}.expert_parallel_size",),
    "rollout_pp": (f"{ROLLOUT}.pipeline_model_parallel_size",),
    "enforce_eager": (f"{ROLLOUT}.enforce_eager",),
    "n_gpus_per_node": ("trainer.n_gpus_per_node",),
    "nnodes": ("trainer.nnodes",),
    "train_batch_size": ("data.train_batch_size",),
    "ppo_mini_batch_size": (f"{ACTOR}.ppo_mini_batch_size",),
    "ppo_micro_batch_size_per_gpu": (f"{ACTOR}.ppo_micro_batch_size_per_gpu",),
    "log_prob_micro_batch_size_per_gpu": (f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu",),
    "ref_log_prob_micro_batch_size_per_gpu": (f"{REF}.log_prob_micro_batch_size_per_gpu",),
    "rollout_n": (f"{ROLLOUT}.n",),
    "use_dynamic_bsz": (f"{ACTOR}.use_dynamic_bsz",),
    "profiler_tool": ("global_profiler.tool",),
    # which roles the run has (verl/trainer/ppo/utils.py: need_reference_policy, need_critic)
    "adv_estimator": ("algorithm.adv_estimator",),
    "use_kl_loss": (f"{ACTOR}.use_kl_loss",),
    "use_kl_in_reward": ("algorithm.use_kl_in_reward",),
    "critic_enable": ("critic.enable",),
    "profiler_steps": ("global_profiler.steps",),
    # what a vLLM consistency rollout changes (workflow/pairing.py) and the log-prob capture needs
    "rollout_max_num_seqs": (f"{ROLLOUT}.max_num_seqs",),
    "rollout_prefix_caching": (f"{ROLLOUT}.enable_prefix_caching",),
    "rollout_chunked_prefill": (f"{ROLLOUT}.enable_chunked_prefill",),
    "rollout_max_num_batched_tokens": (f"{ROLLOUT}.max_num_batched_tokens",),
    "rollout_max_model_len": (f"{ROLLOUT}.max_model_len",),
    "max_prompt_length": ("data.max_prompt_length",),
    "max_response_length": ("data.max_response_length",),
    "calculate_log_probs": (f"{ROLLOUT}.calculate_log_probs",),
    # PPO's clip range, for the report's share of tokens the train-vs-rollout gap alone would clip
    "clip_ratio_low": (f"{ACTOR}.clip_ratio_low",),
    "clip_ratio_high": (f"{ACTOR}.clip_ratio_high",),
}
# Engine facts where no engine section holds the key: FSDP / VeOmni have no TP or PP.
ENGINE_FACT_DEFAULT = {"actor_tp": 1, "actor_pp": 1, "actor_ep": 1, "ref_tp": 1, "ref_pp": 1}
FACT_GROUPS: dict[str, tuple[str, ...]] = {
    key: _ENGINE_GROUPS for key in ("train_backend", *ENGINE_FACT_DEFAULT, "ppo_mini_batch_size", "use_dynamic_bsz")
}
FACT_GROUPS["ppo_micro_batch_size_per_gpu"] = _ENGINE_GROUPS
FACT_GROUPS["ref_log_prob_micro_batch_size_per_gpu"] = _ENGINE_GROUPS
FACT_GROUPS["rollout_backend"] = ("rollout@actor_rollout_ref.rollout",)


# --- the entry point ------------------------------------------------------------------------


@dataclass
class Entry:
    file: Path
    config_path: str | None
    config_name: str | None


def entry_file(verl_root: Path, entry: str, cwd: Path) -> Path:
    """The entry point's file: a module (`verl.trainer.main_ppo`) or a path into the tree's verl package,
    else the file the path names from `cwd`, the folder the launch runs in (an example's own
    `main_ppo_split.py`)."""
    if entry.endswith(".py"):
        parts = Path(entry).parts
        if "verl" in parts:  # .../verl/trainer/main_ppo.py -> <root>/verl/trainer/main_ppo.py
            return verl_root.joinpath(*parts[len(parts) - 1 - parts[::-1].index("verl") :])
        return cwd / entry
    return verl_root.joinpath(*entry.split(".")).with_suffix(".py")


def read_entry(verl_root: Path, entry: str, cwd: Path) -> Entry:
    """The `@hydra.main(config_path=..., config_name=...)` of the entry point, read (not imported)."""
    path = entry_file(verl_root, entry, cwd)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for deco in node.decorator_list:
                if isinstance(deco, ast.Call) and ast.unparse(deco.func) in ("hydra.main", "main"):
                    kw = {k.arg: k.value for k in deco.keywords}
                    return Entry(path, _literal(kw.get("config_path")), _literal(kw.get("config_name")))
    raise ValueError(f"{path}: no @hydra.main entry point")


def _literal(node: ast.expr | None) -> str | None:
    if node is None:
        return None
    value = ast.literal_eval(node)
    return value if isinstance(value, str) else None


# --- the command line, as Hydra parses it ---------------------------------------------------


@dataclass
class HydraArgs:
    """A launch's argv as Hydra's own parser splits it: its flags, and the overrides."""

    overrides: list[Arg]
    config_path: Arg | None = None
    config_name: Arg | None = None
    error: str | None = None  # what Hydra's parser refuses (verl stops on it at start-up)


class _Word(str):
    """A word given to Hydra's parser, and the position of the launch argument it came from."""

    position: int


_MARK = "\x1f"  # the unit separator, between a word and its index: no launch script writes it


def _word(text: str) -> str:
    """Hydra's parser's conversion of every value it takes (an override, a flag's value): the word, as a `_Word`
    that remembers which argument it came from (the `_MARK` suffix `parse_hydra_args` gave it)."""
    base, mark, index = text.rpartition(_MARK)
    if not mark:
        return text
    word = _Word(base)
    word.position = int(index)
    return word


def _refuse(message: str) -> NoReturn:
    raise ValueError(message)


def parse_hydra_args(args: list[Arg]) -> HydraArgs:
    """Split the arguments with Hydra's own parser (`hydra._internal.utils.get_args_parser`, as `@hydra.main`
    does): the flags and their values, the rest overrides, each the argument it was written as. An argv without a
    flag is overrides alone (and Hydra is not imported for it)."""
    if not any(a.text.startswith("-") for a in args):
        return HydraArgs(overrides=list(args))
    from hydra._internal.utils import get_args_parser

    parser = get_args_parser()
    parser.register("type", None, _word)  # every value Hydra's parser takes comes back as a `_Word`
    parser.exit_on_error = False
    parser.error = _refuse  # type: ignore[method-assign]  # an error is the launch's, never an exit of ours
    # a word that is no flag, and a flag's `=value`, carry their position through the parser
    marked = [
        a.text if a.text.startswith("-") and "=" not in a.text else f"{a.text}{_MARK}{i}" for i, a in enumerate(args)
    ]
    try:
        parsed, unknown = parser.parse_known_args(marked)
    except (argparse.ArgumentError, ValueError, SystemExit) as exc:  # SystemExit: --version
        return HydraArgs(overrides=[], error=f"Hydra's command line: {exc}")
    if unknown:  # as Hydra's parse_args refuses them: overrides after a flag that follows overrides, unknown flags
        words = " ".join(w.rpartition(_MARK)[0] or w for w in unknown)
        return HydraArgs(overrides=[], error=f"Hydra's command line: unrecognized arguments: {words}")

    def arg_of(value: str | None) -> Arg | None:
        if value is None:
            return None
        source = args[value.position].source if isinstance(value, _Word) else ""
        return Arg(str(value), source)

    overrides = [args[w.position] if isinstance(w, _Word) else Arg(str(w), "") for w in parsed.overrides]
    return HydraArgs(overrides, arg_of(parsed.config_path), arg_of(parsed.config_name))


# --- composing ------------------------------------------------------------------------------


def compose_launch(
    verl_root: Path | None, entry: str, args: list[Arg], *, cwd: Path, release: str | None = None
) -> Composed:
    """The facts of one verl launch: composed with the tree's config, else the release's defaults."""
    if verl_root is None:
        return apply_overrides_assumed(assumed_facts(release), args)
    launch = parse_hydra_args(args)
    if launch.error is not None:
        return Composed(None, errors=[launch.error])
    try:
        found = read_entry(verl_root, entry, cwd)
    except (OSError, SyntaxError, ValueError) as exc:
        return Composed(None, errors=[f"entry point {entry}: {exc}"])
    config_path = launch.config_path.text if launch.config_path else found.config_path
    config_name = launch.config_name.text if launch.config_name else found.config_name
    if config_name is None or config_path is None:
        return Composed(None, errors=[f"entry point {entry}: no config_path/config_name"])
    config_name = config_name.removesuffix(".yaml")
    # Hydra: an absolute --config-path as is, a relative one against the entry point's folder.
    config_dir = Path(config_path) if os.path.isabs(config_path) else found.file.resolve().parent / config_path
    config_file = f"{config_name}.yaml"
    result = Composed(None, config_file=config_file)
    overrides = [a.text for a in launch.overrides]
    relative = relative_searchpaths(config_dir / config_file)
    missing = [entry for entry in relative if not (cwd / entry).is_dir()]
    if missing and all((verl_root / entry).is_dir() for entry in missing):
        result.searchpath_note = (
            f"{config_file} names hydra.searchpath {', '.join(f'file://{e}' for e in missing)} relative to the "
            f"directory verl runs in; it does not resolve from {cwd}, so it was resolved from the checkout holding "
            f"--verl-root ({verl_root}). verl resolves it the same way only when run from there: "
            f"cd {verl_root} before the launch, or read the script with --cwd DIR"
        )
        cwd = verl_root
    elif missing:
        result.unresolved_searchpath = missing
    try:
        config = _compose(config_dir, config_name, overrides, cwd)
    except Exception as exc:  # Hydra's exceptions and OmegaConf's
        result.errors.append(_blame(exc, launch, config_dir, config_name, cwd))
        return result
    result.config = config
    result.ppo = "actor_rollout_ref" in config
    if not result.ppo:
        result.notes.append(f"{entry} ({config_file}) is not a PPO trainer: no actor / rollout / ref facts")
    default_source = (
        f"{config_file} ({launch.config_name.source})" if launch.config_name else f"verl default ({config_file})"
    )
    with grammar_parsed_once():
        result.facts = read_facts(config, launch.overrides, default_source)
    return result


def relative_searchpaths(config_file: Path) -> list[str]:
    """The relative `file://` entries of a config file's `hydra.searchpath` (Hydra resolves them against
    the process's working directory); [] when the file has none or cannot be read. Read once per process
    until the file changes (each read of a script asks)."""
    try:
        st = config_file.stat()
    except OSError:
        return []
    key = (os.path.realpath(config_file), st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _SEARCHPATHS:
        _SEARCHPATHS[key] = _read_searchpaths(config_file)
    return list(_SEARCHPATHS[key])


_SEARCHPATHS: dict[tuple[str, int, int, int], list[str]] = {}


def _read_searchpaths(config_file: Path) -> list[str]:
    import yaml

    try:
        data = yaml.safe_load(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return []
    hydra = data.get("hydra") if isinstance(data, dict) else None
    entries = hydra.get("searchpath") if isinstance(hydra, dict) else None
    if not isinstance(entries, list):
        return []
    found = [str(e).removeprefix("file://") for e in entries if isinstance(e, str) and e.startswith("file://")]
    return [entry for entry in found if entry and not os.path.isabs(entry)]


def _compose(config_dir: Path, config_name: str, overrides: list[str], cwd: Path) -> Any:
    """`hydra.compose` in `cwd` (relative `file://` search paths), leaving no global state behind."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with _in_dir(cwd), contextlib.redirect_stdout(io.StringIO()), _parsed_once():
            with initialize_config_dir(config_dir=str(config_dir), version_base=None):
                return compose(config_name=config_name, overrides=overrides)
    finally:
        GlobalHydra.instance().clear()


# Each config file as Hydra's own config sources load it (the tree's files, Hydra's own package configs), by
# (real path, inode, size, mtime): a launch's compose reads a few dozen files, a script's derivation or a folder
# of scripts composes many times, and PyYAML's scanner, then OmegaConf's wrapping of every value, were most of the
# time. Kept pickled: Hydra edits what it loads, and unpickling gives each compose its own copy four times faster
# than a deep copy. An edited file has a new key and is loaded again.
_LOADED: dict[tuple[str, int, int, int], tuple[bytes, dict[str, str | None]]] = {}


@contextlib.contextmanager
def _parsed_once() -> Iterator[None]:
    """Hydra's file and package config sources, each file loaded once per process (a copy every time)."""
    import pickle
    from importlib import resources

    from hydra._internal.core_plugins.file_config_source import FileConfigSource
    from hydra._internal.core_plugins.importlib_resources_config_source import ImportlibResourcesConfigSource
    from hydra.plugins.config_source import ConfigResult, ConfigSource

    def file_of(source: ConfigSource, config_path: str) -> str | None:
        name = source._normalize_file_name(config_path)
        if isinstance(source, FileConfigSource):
            return os.path.realpath(os.path.join(source.path, name))
        found = resources.files(source.path).joinpath(name)  # a zip's member is loaded as Hydra loads it
        return os.path.realpath(found) if isinstance(found, Path) else None

    def remembered(original: Callable[[Any, str], ConfigResult]) -> Callable[[Any, str], ConfigResult]:
        def load_config(self: ConfigSource, config_path: str) -> ConfigResult:
            try:
                file = file_of(self, config_path)
                st = os.stat(file) if file is not None else None
            except (OSError, ValueError, ModuleNotFoundError, TypeError):
                file = st = None
            if file is None or st is None:
                return original(self, config_path)  # Hydra's own error where there is no file
            key = (file, st.st_ino, st.st_size, st.st_mtime_ns)
            if key not in _LOADED:
                loaded = original(self, config_path)
                _LOADED[key] = (pickle.dumps(loaded.config), loaded.header)
            config, header = _LOADED[key]
            return ConfigResult(
                config=pickle.loads(config),
                path=f"{self.scheme()}://{self.path}",
                provider=self.provider,
                header=dict(header),
            )

        return load_config

    with contextlib.ExitStack() as stack:
        for source in (FileConfigSource, ImportlibResourcesConfigSource):
            stack.enter_context(_swapped(source, "load_config", remembered(source.load_config)))
        stack.enter_context(grammar_parsed_once())
        yield


@contextlib.contextmanager
def grammar_parsed_once() -> Iterator[None]:
    """OmegaConf's grammar parser, each interpolation (`${oc.select:a.b,1}`) parsed once per process: composing
    and resolving a config parses the same few hundred strings again and again, and ANTLR's parser was a fifth
    of a script's reading. A parse tree is only read after it is built (its tokens keep their own input)."""
    import omegaconf._utils
    import omegaconf.base
    import omegaconf.resolvers.oc

    modules = (omegaconf.base, omegaconf._utils, omegaconf.resolvers.oc)  # each imported `parse` by name
    with contextlib.ExitStack() as stack:
        for module in modules:
            if module.parse is not _memo_parse:  # not already inside
                stack.enter_context(_swapped(module, "parse", _memo_parse))
        yield


@contextlib.contextmanager
def _swapped(owner: object, name: str, value: object) -> Iterator[None]:
    """`owner.name` is `value` inside the block, and what it was before after it."""
    before = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, before)


@functools.lru_cache(maxsize=4096)
def _memo_parse(value: str, parser_rule: str = "configValue", lexer_mode: str = "DEFAULT_MODE") -> Any:
    """OmegaConf's `grammar_parser.parse`, remembered (an error is raised again each time, never kept)."""
    from omegaconf.grammar_parser import parse

    return parse(value, parser_rule, lexer_mode)


@contextlib.contextmanager
def _in_dir(path: Path) -> Iterator[None]:
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def _blame(exc: Exception, launch: HydraArgs, config_dir: Path, config_name: str, cwd: Path) -> str:
    """Hydra's message with the source of the override at fault: the shortest failing prefix."""
    message = " ".join(str(exc).split()) or type(exc).__name__
    texts = [a.text for a in launch.overrides]
    where = _config_source(launch)

    def fails(n: int) -> bool:
        try:
            _compose(config_dir, config_name, texts[:n], cwd)
        except Exception:
            return True
        return False

    if texts and not fails(0):
        lo, hi = 1, len(texts)  # texts[:hi] fails, texts[:lo-1] composes
        while lo < hi:
            mid = (lo + hi) // 2
            if fails(mid):
                hi = mid
            else:
                lo = mid + 1
        culprit = launch.overrides[lo - 1]
        where = f"{culprit.source}: {culprit.text}"
    return f"{where}: {message}"


def _config_source(launch: HydraArgs) -> str:
    chosen = [a for a in (launch.config_path, launch.config_name) if a is not None]
    return ", ".join(f"{a.source}: {a.text}" for a in chosen) or "verl config"


# --- facts ----------------------------------------------------------------------------------


def override_key(text: str) -> str:
    """The key an override sets: `++a.b=1` -> `a.b`, `actor@actor_rollout_ref.actor=x` -> as is."""
    key = text.split("=", 1)[0].lstrip("+~")
    return key


def _covers(key: str, path: str) -> bool:
    """An override of `key` sets `path` (the key itself, a parent, or a group placed at a parent)."""
    package = key.split("@", 1)[1] if "@" in key else key
    return path == package or path.startswith(package + ".")


def _select(config: Any, key: str) -> tuple[bool, Any]:
    """(present, value) of a dotted key; unresolvable interpolations give their message."""
    from omegaconf import OmegaConf

    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(config, parent_key) if parent_key else config
    if parent is None or not OmegaConf.is_dict(parent) or leaf not in parent.keys():
        return False, None
    if OmegaConf.is_missing(parent, leaf):
        return True, None
    try:
        value = OmegaConf.select(config, key, throw_on_resolution_failure=True)
    except Exception as exc:
        return True, f"<unresolved: {' '.join(str(exc).split())}>"
    return True, OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


_INTERP = re.compile(r"^\$\{(?:oc\.select:)?([\w.]+)(?:,[^}]*)?\}$")


def _interpolated_from(config: Any, key: str) -> str | None:
    """`a.b` when the node at `key` is `${a.b}` or `${oc.select:a.b,default}`."""
    from omegaconf import OmegaConf

    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(config, parent_key) if parent_key else config
    if parent is None or not OmegaConf.is_dict(parent) or leaf not in parent.keys():
        return None
    raw = parent._get_node(leaf)
    match = _INTERP.match(str(raw._value())) if raw is not None and raw._is_interpolation() else None
    return match.group(1) if match else None


def _source(config: Any, fact: str, key: str, overrides: list[Arg], default: str) -> str:
    position, source = _last_setter(config, fact, key, overrides, 0)
    return source if position >= 0 else default


def _last_setter(config: Any, fact: str, key: str, overrides: list[Arg], depth: int) -> tuple[int, str]:
    """(position, source) of the last override that set `key` or its parent, else of the last one that
    chose its group; for an interpolated node (`${oc.select:other,1}`), the later of that and the one
    that set `other`. Hydra composes the defaults list (group choices such as `model_engine=megatron`)
    before it applies any value override, wherever each stands on the command line: a value override
    of the key wins over a group choice written after it."""
    groups = FACT_GROUPS.get(fact, ())
    found = (-1, "")
    keys = [override_key(arg.text) for arg in overrides]
    direct = [position for position, okey in enumerate(keys) if _covers(okey, key)]
    chosen = direct or [position for position, okey in enumerate(keys) if okey in groups]
    if chosen:
        found = (chosen[-1], overrides[chosen[-1]].source)
    target = _interpolated_from(config, key) if depth < 4 else None
    if target:
        found = max(found, _last_setter(config, fact, target, overrides, depth + 1))
    return found


def read_facts(config: Any, overrides: list[Arg], default_source: str) -> dict[str, Fact]:
    """Each fact the config has: its value and the last override that set it, else the config file."""
    facts: dict[str, Fact] = {}
    for fact, keys in FACT_KEYS.items():
        for key in keys:
            present, value = _select(config, key)
            if present:
                facts[fact] = Fact(value, _source(config, fact, key, overrides, default_source))
                break
        else:
            if fact in ENGINE_FACT_DEFAULT and _select(config, ACTOR)[0]:
                backend = facts.get("train_backend")
                source = backend.source if backend else default_source
                facts[fact] = Fact(ENGINE_FACT_DEFAULT[fact], source)
    return facts


# --- without a tree: the catalogue's release defaults ---------------------------------------


def release_defaults_path() -> Path:
    return releases("verl").path


def release_defaults(release: str) -> tuple[str, dict[str, Any]] | None:
    """(range label, defaults) of the release data's entry for `release`, None when none covers it.

    Entries cover `from` <= release < `below` (no `below`: open-ended)."""
    found = releases("verl").defaults_for(release)
    return None if found is None else (found.label, dict(found.defaults))


def assumed_facts(release: str | None) -> Composed:
    """The release defaults the reader falls back to without a tree, marked as assumed."""
    result = Composed(None, assumed=True, config_file="ppo_trainer.yaml")
    if release is None:
        release = releases("verl").assume_when_unknown
        result.notes.append(f"verl release unknown: assuming {release}")
    found = release_defaults(release)
    if found is None:
        result.errors.append(f"no release defaults for verl {release} in {release_defaults_path().name}")
        return result
    _, defaults = found
    source = f"assumed: verl {release} default (catalogue)"
    result.facts = {key: Fact(value, source) for key, value in defaults.items()}
    return result


def apply_overrides_assumed(result: Composed, args: list[Arg]) -> Composed:
    """Without a tree: the defaults, with the overrides that set a fact's key directly on top.

    No Hydra here: values are taken as written (`true`/`false`/integers/`null` converted)."""
    launch = parse_hydra_args(args)
    if launch.error is not None:
        result.errors.append(launch.error)
    for arg in launch.overrides:
        key, eq, text = arg.text.partition("=")
        if not eq or key.startswith("~"):
            continue
        key = key.lstrip("+")
        for fact, keys in FACT_KEYS.items():
            if key in keys:
                result.facts[fact] = Fact(_scalar(text), arg.source)
        if key == "model_engine":
            result.facts["train_backend"] = Fact("fsdp" if text == "dp" else text, arg.source)
    if launch.config_name and "megatron" in launch.config_name.text:
        facts = result.facts
        if facts.get("train_backend") and facts["train_backend"].source.startswith("assumed"):
            facts["train_backend"] = Fact("megatron", launch.config_name.source)
    return result


def _scalar(text: str) -> Any:
    lowered = text.strip().strip("'\"")
    if lowered.lower() in ("true", "false"):
        return lowered.lower() == "true"
    if lowered.lower() in ("null", "~"):
        return None
    try:
        return int(lowered)
    except ValueError:
        return lowered
