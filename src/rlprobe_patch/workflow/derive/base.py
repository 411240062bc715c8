"""What every framework's collection script shares: requirements, changes, checks, the adapter.

`script` derives a collection script from a training script and `check-script` checks one. The
skill's run templates copy the user's script, `sed` one flag and append overrides; here each
training framework (`Framework`: `verl.Verl`, `slime.Slime`) says what its run needs
(`Requirements`), writes the derived script (the original file is never written) and checks its
own settings; the switches, msprobe configs and notices are checked here, the same for all.
"""

from __future__ import annotations

import abc
import datetime as dt
import functools
import importlib.util
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from packaging.version import InvalidVersion, Version

from rlprobe_patch.base.errors import RefusedError
from rlprobe_patch.base.fsio import atomic_write
from rlprobe_patch.catalogue.releases import patches_dir
from rlprobe_patch.launch.model import Script, is_true
from rlprobe_patch.launch.shell import Probe
from rlprobe_patch.workflow.config import SGLANG_STEP_WARNING, read_config, rule_problems
from rlprobe_patch.workflow.detect import Detection
from rlprobe_patch.workflow.engines import VllmEngine


@dataclass
class Requirement:
    key: str
    value: Any
    why: str
    only_if_present: bool = False  # e.g. skip switches: turned off where the script turns them on
    create: bool = False  # `++key=`: needed even where the release's config has no such key
    soft: bool = False  # another value still collects (more steps): check-script warns instead of failing

    @property
    def text(self) -> str:
        return hydra_text(self.value)


@dataclass
class Requirements:
    mode: str
    train_backend: str
    rollout_backend: str
    settings: list[Requirement] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    refusals: list[str] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    configs: dict[str, str] = field(default_factory=dict)  # side -> config path the script uses
    fixes: list[str] = field(default_factory=list)  # `script` options that would make a refused run derivable
    pinned: dict[str, str] = field(default_factory=dict)  # the --env values the derivation assumed
    # import probes the derivation answered, pinned: exported at the top where the script keeps an
    # exported value (`${NAME:-$(...)}`), else assigned again on the line after the probe's
    probes: dict[str, Probe] = field(default_factory=dict)
    blocked: str = ""  # why no option makes this run collectable in this mode (e.g. a rollout without a dump)
    checks: list[ScriptCheck] = field(default_factory=list)  # what check-script adds about the environment
    capture: bool = False  # the consistency collection's log-prob capture run (`Framework.capture_run`)

    def header(self, lines: str) -> str:
        """The derived script's opening comment, then the environment it was derived with, exported before
        the user's own lines, so that bash runs what was checked (a variable the script reads, such as
        INFER_BACKEND, otherwise takes whatever value the shell that runs it has)."""
        if self.pinned:
            pins = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in self.pinned.items())
            lines += "# rlprobe-patch: the environment this script was derived with (--env)\n" + pins
        exported = {name: probe for name, probe in self.probes.items() if probe.keeps}
        if exported:
            pins = "".join(
                f"export {name}={shlex.quote(probe.value)}  # {probe.where}\n" for name, probe in exported.items()
            )
            lines += "# rlprobe-patch: the import probes' answers this script was derived with\n" + pins
        return lines

    def probe_pins(self, data: bytes) -> list[tuple[int, bytes]]:
        """(offset, text) insertions into the script's bytes `data`: after each `NAME=$(import probe)`
        that bash would run again, the answer the derivation used, assigned on a line of its own."""
        pins = []
        for name, probe in self.probes.items():
            if probe.keeps or probe.line_end is None:
                continue
            probe_line = data[data.rfind(b"\n", 0, probe.line_end) + 1 : probe.line_end]
            indent = probe_line[: len(probe_line) - len(probe_line.lstrip())]
            line = f"{name}={shlex.quote(probe.value)}  # rlprobe-patch: the probe's answer when derived"
            pins.append((probe.line_end, b"\n" + indent + line.encode()))
        return pins

    def add(self, key: str, value: Any, why: str, **kw: Any) -> None:
        self.settings = [r for r in self.settings if r.key != key]
        self.settings.append(Requirement(key, value, why, **kw))


def hydra_text(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, list):
        return "[" + ",".join(hydra_text(v) for v in value) + "]"
    return str(value)


def version_or_none(text: str | None) -> Version | None:
    try:
        return Version(text) if text else None
    except InvalidVersion:
        return None


@dataclass
class Change:
    key: str
    value: str
    why: str
    action: str  # "set" (appended, the script had another value), "added", "kept", "skipped"
    source: str | None = None  # where the value it replaces came from
    old: Any = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def default_output(original: Path, mode: str) -> Path:
    return original.parent / f"run_{mode}_dump_{dt.date.today().strftime('%Y%m%d')}.sh"


def capture_output(dump_script: Path) -> Path:
    """Where `script` writes the log-prob capture run of a consistency collection: beside its dump script."""
    return dump_script.with_name(f"{dump_script.stem}.capture{dump_script.suffix}")


def write_script(original: Path, output: Path, text: str, force: bool) -> None:
    original = original.resolve()
    if output.resolve() == original:
        raise RefusedError(f"-o {output} is the original script; refusing to edit it", hint="name a new file")
    if output.exists() and not force:
        raise RefusedError(f"{output} exists", hint="pass --force to replace it, or name another file with -o")
    atomic_write(output, text.encode("utf-8"), original.stat().st_mode & 0o777 | 0o100)


@dataclass
class ScriptCheck:
    name: str
    ok: bool
    detail: str = ""
    warning: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RunOptions:
    """What the user says of the run beyond its script (the options of `script` / `check-script`)."""

    train_backend: str | None = None  # default: detected
    rollout_backend: str | None = None  # default: detected
    n_gpus: int | None = None  # training GPUs in all; default: from the script
    configs: dict[str, str] = field(default_factory=dict)  # side -> the msprobe config it uses
    versions: dict[str, str | None] = field(default_factory=dict)  # package -> the release it runs
    stages: tuple[str, ...] = ()  # training mode's stages; default: every one
    save_path: str | None = None  # training mode's global_profiler.save_path
    vllm_engine: VllmEngine | None = None  # the engine behind rollout.name=vllm (unknown when None)
    python: str | None = None  # the training environment's interpreter (--python), for the fixes named


class Framework(abc.ABC):
    """What one training framework provides to derive and check a collection script.

    One subclass per framework (`verl`, `slime`), chosen once from the table in this package's
    `__init__` by `Script.framework` (which launch `launch.script.read_script` found)."""

    name: ClassVar[str]
    facts_shown: ClassVar[tuple[str, ...]]  # the run's facts `detect` prints
    dump_config_arg: ClassVar[str]  # how check-script names the rollout's dump config argument

    @abc.abstractmethod
    def requirements(self, detection: Detection, mode: str, options: RunOptions) -> Requirements:
        """What a `mode` collection run of this script needs: settings, switches, refusals, notices."""

    @abc.abstractmethod
    def render(self, script: Script, req: Requirements, source_name: str, composed: bool) -> tuple[str, list[Change]]:
        """The derived script's text (the original is never edited) and each change made."""

    @abc.abstractmethod
    def check(self, script: Script, req: Requirements) -> list[ScriptCheck]:
        """The script's settings against `req`, and its refusals (`common_checks` does the rest)."""

    @abc.abstractmethod
    def config_paths(self, script: Script, mode: str) -> dict[str, str]:
        """The msprobe configs the script already names, by side (actor, generate, training)."""

    @abc.abstractmethod
    def switches(self) -> Any:
        """The switch reader this framework's hooks run (DUMP_ON, DUMP_PHASE, ...)."""

    def capture_run(self, req: Requirements) -> Requirements | None:
        """The consistency collection's second run, the log-prob capture for `report` (None: this framework
        has no capture hook). The dump run cannot capture: PROMPTS_ONLY cuts its batches to their prompts."""
        return None


def common_checks(script: Script, req: Requirements, framework: Framework) -> list[ScriptCheck]:
    """What every framework's collection script is checked for: the exported switches (by the
    hooks' own reader), the actor config, the msprobe configs it names, the notices."""
    checks: list[ScriptCheck] = []
    for name, value in req.env.items():
        current = script.env.get(name)
        if current is None:
            checks.append(ScriptCheck(f"export {name}={value}", False, "not exported"))
        elif str(current.value) != value and not (value == "1" and is_true(current.value)):
            checks.append(ScriptCheck(f"export {name}={value}", False, f"is {current.value!r} at {current.source}"))
        else:
            checks.append(ScriptCheck(f"export {name}={value}", True, current.source))
    if req.mode == "consistency" and not req.capture and "MSPROBE_ACTOR_CONFIG" not in req.env:
        current = script.env.get("MSPROBE_ACTOR_CONFIG")
        checks.append(
            ScriptCheck(
                "export MSPROBE_ACTOR_CONFIG",
                current is not None,
                current.source if current else "not exported (the hook falls back to /home/config_actor.json)",
            )
        )
    checks.extend(_switch_checks(script, framework.switches()))
    # the capture run loads no msprobe config (DUMP_ON off): Framework.check fails a rollout dump config in it
    checks.extend(_config_checks(script, req, {} if req.capture else framework.config_paths(script, req.mode)))
    for notice in req.notices:
        checks.append(ScriptCheck("notice", True, notice, warning=True))
    return checks


@functools.cache
def shared_switches() -> Any:
    """The switch reader the hooks run (`Switches` of `patches/_shared/switches.py`, whose methods
    are spliced into every hook), as an instance: run here on the script's values."""
    return load_shared("switches").Switches()


def load_shared(name: str) -> Any:
    """`patches/_shared/<name>.py`, the code the hooks splice in, loaded to run here."""
    path = patches_dir() / "_shared" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"rlprobe_patch_shared_{name}", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SWITCH_NAMES = ("DUMP_ON", "PROMPTS_ONLY", "DUMP_PHASE")


def _switch_checks(script: Script, reader: Any) -> list[ScriptCheck]:
    """The values the script exports for the hooks' switches, checked by the hooks' own reader."""
    exported = {name: script.env[name] for name in SWITCH_NAMES if name in script.env}
    known = {name: s for name, s in exported.items() if _exact_env(script, name)}
    checks = [
        ScriptCheck(f"{name} value", True, f"{s.source}: set by the run, not known before it: not checked", True)
        for name, s in exported.items()
        if name not in known
    ]
    values = {name: str(s.value) for name, s in known.items()}
    bad = []
    for name, s in known.items():
        try:
            if name == "DUMP_PHASE":
                reader._rlprobe_switches({name: values[name]})
            else:
                reader._rlprobe_switch(name, {name: values[name]})
        except ValueError as exc:
            bad.append(name)
            checks.append(ScriptCheck(f"{name} value", False, f"{s.source}: {_plain(exc)}"))
    if not bad and known:
        switches = reader._rlprobe_switches(values)
        checks += [ScriptCheck("switches", True, _plain(w), warning=True) for w in switches["warnings"]]
        if switches["dump_on"] and "MSPROBE_ACTOR_CONFIG" in script.env and _exact_env(script, "MSPROBE_ACTOR_CONFIG"):
            checks.extend(_actor_config_check(script, reader))
    return checks


def launch_cwd(script: Script) -> Path:
    """The directory the launch runs in, which its relative paths resolve against: where bash runs the
    script from (--cwd, else the current directory), after the script's own `cd`s."""
    return script.launch.run.cwd.absolute() if script.launch is not None else Path.cwd()


def capture_folder(script: Script) -> str | None:
    """The `MISMATCH_DIR` a capture run must export, absolute, so that the rollout engine's processes
    (`vllm.rollout-record`), in other working directories, write their records beside the trainer's
    capture: the script's own relative value (the hooks' default `rlprobe-logprobs` where it sets none)
    resolved against the directory the launch runs in, the folder the trainer writes to. None where the
    script's own is absolute (kept as written: `$HOME/caps` stays) or set by the run."""
    current = script.env.get("MISMATCH_DIR")
    value = str(current.value).strip() if current is not None else ""
    if not _exact_env(script, "MISMATCH_DIR") or Path(value).is_absolute():
        return None
    return str(launch_cwd(script) / (value or "rlprobe-logprobs"))


def resolve_config(script: Script, path: str) -> tuple[Path, str]:
    """(the file a config path names, how it was resolved): a relative path is read by the launched
    process, from the directory it runs in, never from the script's folder."""
    if Path(path).is_absolute():
        return Path(path), "an absolute path"
    cwd = launch_cwd(script)
    return cwd / path, (
        f"{path} is relative: resolved against {cwd}, the directory the launch runs in (where bash runs the "
        "script from: --cwd, else the current directory; then the script's own cd)"
    )


def _actor_config_check(script: Script, reader: Any) -> list[ScriptCheck]:
    setting = script.env["MSPROBE_ACTOR_CONFIG"]
    resolved, _ = resolve_config(script, str(setting.value))
    if not resolved.exists():
        return []  # _config_checks fails it, naming the file
    try:
        reader._rlprobe_config_path("MSPROBE_ACTOR_CONFIG", "", {"MSPROBE_ACTOR_CONFIG": str(resolved)})
    except ValueError as exc:
        return [ScriptCheck("MSPROBE_ACTOR_CONFIG", False, f"{setting.source}: {_plain(exc)}")]
    return []


def _exact_env(script: Script, name: str) -> bool:
    field_ = script.launch.env.get(name) if script.launch is not None else None
    return field_ is None or field_.exact


def _plain(exc: object) -> str:
    return str(exc).removeprefix("rlprobe-patch: ")


def _config_checks(script: Script, req: Requirements, paths: dict[str, str]) -> list[ScriptCheck]:
    checks = []
    dump_paths: dict[str, str] = {}
    for side, path in paths.items():
        resolved, how = resolve_config(script, path)
        if not resolved.is_file():
            fix = "write it with rlprobe-patch config" + ("" if Path(path).is_absolute() else ", or pass --cwd DIR")
            checks.append(ScriptCheck(f"{side} config {path}", False, f"no such file: {resolved} ({how}); {fix}"))
            continue
        try:
            data = read_config(resolved)
        except RefusedError as exc:
            checks.append(ScriptCheck(f"{side} config {path}", False, exc.message))
            continue
        problems = rule_problems(data, req.mode, side, req.rollout_backend)
        errors = [p for p in problems if not p.startswith(("level", SGLANG_STEP_WARNING))]
        for p in problems:
            checks.append(ScriptCheck(f"{side} config {path}", p not in errors, p, warning=p not in errors))
        if not errors:
            checks.append(ScriptCheck(f"{side} config {path}", True, "follows the rules for its side"))
        if data.get("dump_path"):
            dump_paths[side] = str(data["dump_path"])
    if len(dump_paths) == 2 and len(set(dump_paths.values())) == 1:
        checks.append(
            ScriptCheck("dump_path per side", False, f"actor and generate both dump to {dump_paths['actor']}")
        )
    return checks
