"""The test oracle for launch scripts: what bash and Hydra make of them, independent of our reader.

Each script runs under `bash` with every launcher on PATH (`python3`, `uv`, `torchrun`, `ray`,
...) replaced by a recorder that writes its argv and exits, in a temporary verl checkout
(`examples/` and `verl/` linked in, the way users run `bash examples/x/run.sh` from the repo
root, or from the folder an example says to run it in), `env -i`, a temporary HOME, no network.
Each recorded verl launch (`-m verl.X`, a path to a file of the verl package with `@hydra.main`,
or such a file in the folder the run is in) is then parsed by Hydra's own argument parser and
composed with `hydra.compose` against the release's own config (each file's text loaded by OmegaConf once per
process, every compose given a copy). Nothing from rlprobe_patch is used here except the wheel download helper.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rlprobe_patch.catalogue.wheels import cache_dir, fetch_wheel

SHARED = Path(__file__).resolve().parents[2] / "shared"
EXAMPLES = SHARED / "upstream" / "verl-examples"
CORPORA = {"v0.6.1": "0.6.1", "v0.8.0": "0.8.0"}  # corpus folder -> the verl release it belongs to
TRUTH_KEYS = ("train_backend", "rollout_backend", "use_legacy_worker_impl", "use_v1", "actor_tp", "rollout_tp")
SCRIPT_TIMEOUT_S = 20

# Commands that must not really run. All record and exit 0, except `python -c` (module probes
# such as `python3 -c 'import torch_npu'` fail, as on a machine without the module).
LAUNCHERS = (
    "python", "python3", *(f"python3.{minor}" for minor in range(8, 15)), "uv", "uvx", "pip", "pip3",
    "torchrun", "ray", "accelerate", "deepspeed", "srun", "sbatch", "salloc", "scontrol", "mpirun", "mpiexec",
    "nvidia-smi", "npu-smi", "git", "wget", "curl", "huggingface-cli", "hf", "modelscope", "sleep",
    "docker", "ssh", "scp", "rsync", "apt", "apt-get", "conda", "sudo", "wandb", "mlflow", "tensorboard",
)  # fmt: skip
RECORDER = r"""#!/bin/bash
name=$(basename "$0")
printf '%s\0' "$name" "$@" $'\x1e' >> "$ORACLE_RECORD"
case "$name" in python*) for a in "$@"; do [ "$a" = "-c" ] && exit 1; done ;; esac
exit 0
"""
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass
class Launch:
    """A recorded verl launch and what Hydra made of it."""

    entry: str  # module (verl.trainer.main_ppo) or the file's path inside verl/
    args: list[str]
    config_name: str = ""
    error: str = ""  # Hydra's message when the overrides do not compose
    ppo: bool = False  # the composed config is a PPO trainer's (actor_rollout_ref.*)
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass
class Truth:
    """One script: its recorded calls, its verl launches, the main one's facts."""

    script: str  # relative to the corpus's examples/ folder
    exit_code: int | None  # None: timed out
    calls: list[list[str]]
    launches: list[Launch]
    stderr_tail: str = ""

    @property
    def main(self) -> Launch | None:
        """The launch detect speaks about: the first PPO trainer launch, else the first launch."""
        return next((lt for lt in self.launches if lt.ppo), self.launches[0] if self.launches else None)

    @property
    def composes(self) -> bool:
        return self.main is not None and not self.main.error and self.main.ppo

    @property
    def status(self) -> str:
        """One of: composes, no verl launch, not a PPO trainer, hydra error."""
        main = self.main
        if main is None:
            return "no verl launch"
        if main.error:
            return "hydra error"
        return "composes" if main.ppo else "not a PPO trainer"


# --- trees and corpora ----------------------------------------------------------------------


@contextlib.contextmanager
def _locked(name: str) -> Iterator[Path]:
    folder = cache_dir() / "oracle"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield folder


def verl_root(release: str) -> Path:
    """The release's `verl/` package unpacked once into the test cache (root holding `verl/`)."""
    wheel = fetch_wheel("verl", release)
    with _locked(f"tree-{release}") as folder:
        root = folder / f"verl-{release}"
        if not (root / ".complete").is_file():
            shutil.rmtree(root, ignore_errors=True)
            with zipfile.ZipFile(wheel) as zf:
                for member in zf.namelist():
                    if member.startswith("verl/"):
                        zf.extract(member, root)
            (root / ".complete").write_text(wheel.name)
    return root


def corpus_scripts(corpus: str) -> list[Path]:
    examples = EXAMPLES / corpus / "examples"
    return sorted(examples.rglob("*.sh"))


# --- running a script under bash --------------------------------------------------------------


_HYDRA = threading.Lock()  # Hydra's state and the working directory are process-wide


def run_script(corpus: str, script: Path, root: Path) -> Truth:
    """Run one script with the recorders in a temporary checkout; compose its verl launches there."""
    examples = EXAMPLES / corpus / "examples"
    rel = script.relative_to(examples).as_posix()
    with tempfile.TemporaryDirectory(prefix="oracle-") as tmp:
        checkout = Path(tmp) / "verl"
        checkout.mkdir()
        (checkout / "examples").symlink_to(examples)
        (checkout / "verl").symlink_to(root / "verl")
        truth = run_in_checkout(checkout, f"examples/{rel}", root)
    truth.script = rel
    return truth


def run_in_checkout(
    checkout: Path, rel: str, root: Path, configs: list[Any] | None = None, *, workdir: str = ""
) -> Truth:
    """bash `rel` from the root of `checkout` (a folder holding `examples/` and `verl/`), launchers recorded.

    `configs`, when given, receives the composed config of each launch that composes (in the
    order of `Truth.launches`; None for one that does not), for checks on any key without a
    second compose. `workdir` (relative to the checkout) is the folder bash runs in instead of the
    root (`cd examples/split_placement && bash run_deepseek7b_llm.sh`, as that example's README says)."""
    run_dir = checkout / workdir
    with tempfile.TemporaryDirectory(prefix="oracle-run-") as tmp:
        work = Path(tmp)
        home, bin_dir = work / "home", work / "bin"
        for folder in (home, bin_dir):
            folder.mkdir()
        for name in LAUNCHERS:
            (bin_dir / name).write_text(RECORDER)
            (bin_dir / name).chmod(0o755)
        record = work / "record"
        record.touch()
        env = {"PATH": f"{bin_dir}:{SYSTEM_PATH}", "HOME": str(home), "ORACLE_RECORD": str(record)}
        env |= {"LANG": "C.UTF-8", "TMPDIR": str(work), "USER": "oracle"}
        # A raised open-files limit is refused in this sandbox, not on the users' machines.
        env["BASH_FUNC_ulimit%%"] = '() { builtin ulimit "$@" 2>/dev/null || return 0; }'
        try:
            proc = subprocess.run(
                ["bash", os.path.relpath(checkout / rel, run_dir)], cwd=run_dir, env=env, stdin=subprocess.DEVNULL,
                capture_output=True, timeout=SCRIPT_TIMEOUT_S, check=False,
            )  # fmt: skip
            exit_code: int | None = proc.returncode
            stderr = proc.stderr.decode(errors="replace")
        except subprocess.TimeoutExpired:
            exit_code, stderr = None, "timed out"
        calls = _read_record(record.read_bytes())
        with _HYDRA:
            launches = []
            for entry, args in _verl_launches(calls, root, run_dir):
                holder: list[Any] = []
                launches.append(_compose(entry, args, root, run_dir, keep=holder))
                if configs is not None:
                    configs.append(holder[0] if holder else None)
    tail = "\n".join(stderr.splitlines()[-5:]).replace(tmp, "/oracle-tmp")
    return Truth(rel, exit_code, _untmp(calls, tmp), _untmp_launches(launches, tmp), tail)


# Each launcher, a bash function exported to the script, records the environment it starts with.
ENV_RECORD = "__ENV__"
_ENV_WRAPPER = """#!/bin/bash
__record_env() {{ printf '%s\\0' {marker} {names} $'\\x1e' >> "$ORACLE_RECORD"; }}
python3() {{ __record_env; command python3 "$@"; }}
python() {{ __record_env; command python "$@"; }}
ray() {{ __record_env; command ray "$@"; }}
torchrun() {{ __record_env; command torchrun "$@"; }}
export -f __record_env python3 python ray torchrun
bash {script}
"""


def run_recording_env(
    checkout: Path, rel: str, root: Path, names: list[str], configs: list[Any] | None = None
) -> Truth:
    """`run_in_checkout` of `rel`, with `python3`, `python`, `ray` and `torchrun` also recording the
    values of `names` in the environment they start with (`launched_env` reads them back)."""
    values = " ".join(f'"{n}=${{{n}-<unset>}}"' for n in names)
    (checkout / "wrapped.sh").write_text(_ENV_WRAPPER.format(marker=ENV_RECORD, names=values, script=rel))
    return run_in_checkout(checkout, "wrapped.sh", root, configs)


def main_config(truth: Truth, configs: list[Any]) -> Any:
    """The composed config of `truth.main`, from the `configs` its run filled (`run_in_checkout`)."""
    assert truth.main is not None
    return configs[truth.launches.index(truth.main)]


def launched_env(calls: list[list[str]]) -> dict[str, str]:
    """The environment recorded just before the verl launch (the last record before a `-m verl...` call)."""
    env: dict[str, str] = {}
    for argv in calls:
        if argv and argv[0] == ENV_RECORD:
            env = dict(item.split("=", 1) for item in argv[1:])
        elif any(a.startswith("verl.") or "/verl/" in a for a in argv):
            return env
    return env


def _untmp(calls: list[list[str]], tmp: str) -> list[list[str]]:
    """Recorded argv with the temporary folder named `/oracle-tmp` (stable across runs)."""
    return [[arg.replace(tmp, "/oracle-tmp") for arg in argv] for argv in calls]


def _untmp_launches(launches: list[Launch], tmp: str) -> list[Launch]:
    for launch in launches:
        launch.args = [arg.replace(tmp, "/oracle-tmp") for arg in launch.args]
        launch.error = launch.error.replace(tmp, "/oracle-tmp")
    return launches


def _read_record(data: bytes) -> list[list[str]]:
    calls, current = [], []
    for item in data.split(b"\0"):
        if item == b"\x1e":
            calls.append(current)
            current = []
        elif item or current:
            current.append(item.decode(errors="replace"))
    return calls


_HYDRA_MAIN = re.compile(r"@hydra\.main\(([^)]*)\)")


def _hydra_main(path: Path) -> tuple[str, str] | None:
    """(config_path, config_name) of the file's `@hydra.main`, None when it has none."""
    if not path.is_file():
        return None
    found = _HYDRA_MAIN.search(path.read_text(encoding="utf-8", errors="replace"))
    if not found:
        return None
    kwargs = dict(re.findall(r"(config_path|config_name)\s*=\s*[\"']([^\"']*)[\"']", found.group(1)))
    return kwargs.get("config_path", ""), kwargs.get("config_name", "")


def _entry_path(token: str, root: Path, cwd: Path | None = None) -> Path | None:
    """The file in the release tree a module name or a path names; a path outside the verl package, the
    file it names from `cwd` (the folder the run is in), where there is one."""
    if token.endswith(".py"):
        parts = Path(token).parts
        if "verl" not in parts:
            beside = cwd / token if cwd is not None else None
            return beside if beside is not None and beside.is_file() else None
        start = len(parts) - 1 - parts[::-1].index("verl")
        return root.joinpath(*parts[start:])
    if token.startswith("verl."):
        return root.joinpath(*token.split(".")).with_suffix(".py")
    return None


def _verl_launches(calls: list[list[str]], root: Path, cwd: Path) -> Iterator[tuple[str, list[str]]]:
    """(entry, Hydra argv) of every recorded call that starts a verl `@hydra.main` entry point (a file of
    the verl package, or a file in `cwd`, the folder the run is in, such as an example's own entry point)."""
    for argv in calls:
        for i, token in enumerate(argv):
            entry = argv[i + 1] if token == "-m" and i + 1 < len(argv) else token
            rest = argv[i + 2 :] if token == "-m" else argv[i + 1 :]
            if token != "-m" and not token.endswith(".py"):
                continue
            path = _entry_path(entry, root, cwd)
            if path is not None and _hydra_main(path) is not None:
                yield entry, rest
                break


def printed_not_launched(changes: list[dict[str, Any]], args: list[str]) -> list[str]:
    """The overrides `script` printed as set or added (its `--json` `changes`) that the recorded
    launch does not end up with: each key's last value on the launch's command line counts."""
    last: dict[str, str] = {}
    for arg in args:
        key, eq, value = arg.lstrip("+").partition("=")
        if eq:
            last[key] = value
    printed = {c["key"]: c["value"] for c in changes if c["action"] in ("set", "added")}
    return [f"{k}: printed {v!r}, launched {last.get(k)!r}" for k, v in printed.items() if last.get(k) != v]


# --- Hydra ----------------------------------------------------------------------------------


def compose_config(entry: str, args: list[str], root: Path, cwd: Path) -> Any:
    """The composed config of a recorded launch (Hydra's own parser and compose), for checks on any key."""
    holder: list[Any] = []
    launch = _compose(entry, args, root, cwd, keep=holder)
    if launch.error:
        raise AssertionError(f"{entry}: Hydra refuses {args}: {launch.error}")
    return holder[0]


def _compose(entry: str, args: list[str], root: Path, cwd: Path, keep: list[Any] | None = None) -> Launch:
    """Hydra's parser and compose, as `@hydra.main` of the entry would (relative --config-path:
    against the entry's folder; relative `file://` search paths: against the working directory)."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.utils import get_args_parser
    from hydra.core.global_hydra import GlobalHydra

    path = _entry_path(entry, root, cwd)
    assert path is not None
    main = _hydra_main(path)
    assert main is not None
    launch = Launch(entry, args)
    try:
        parsed = get_args_parser().parse_args(args)
    except SystemExit:
        launch.error = "Hydra's argument parser refused the command line"
        return launch
    config_path = parsed.config_path if parsed.config_path is not None else main[0]
    config_name = (parsed.config_name if parsed.config_name is not None else main[1]).removesuffix(".yaml")
    config_dir = config_path if os.path.isabs(config_path) else os.path.join(path.resolve().parent, config_path)
    launch.config_name = config_name
    before = os.getcwd()
    GlobalHydra.instance().clear()
    try:
        os.chdir(cwd)
        with _each_text_loaded_once(), initialize_config_dir(os.path.normpath(config_dir), version_base=None):
            config = compose(config_name=config_name, overrides=parsed.overrides)
    except Exception as exc:
        launch.error = " ".join(str(exc).split()) or type(exc).__name__
        return launch
    finally:
        os.chdir(before)
        GlobalHydra.instance().clear()
    if keep is not None:
        keep.append(config)
    launch.ppo = "actor_rollout_ref" in config
    if launch.ppo:
        launch.facts = truth_facts(config)
    return launch


_LOADED: dict[str | bytes, Any] = {}  # a config file's text -> what OmegaConf.load made of it


@contextlib.contextmanager
def _each_text_loaded_once() -> Iterator[None]:
    """`OmegaConf.load`, with which Hydra's config sources load every file, remembered by the text it reads: every
    compose loads the same few dozen files, and PyYAML's scanner and OmegaConf's wrapping of each value were most
    of the oracle's time. Each load is given its own deep copy (Hydra edits what it loads)."""
    from omegaconf import OmegaConf

    original = OmegaConf.__dict__["load"]

    def load(file_: Any) -> Any:
        if not hasattr(file_, "read"):
            return original(file_)
        text = file_.read()
        if text not in _LOADED:
            _LOADED[text] = original(io.BytesIO(text) if isinstance(text, bytes) else io.StringIO(text))
        return copy.deepcopy(_LOADED[text])

    OmegaConf.load = staticmethod(load)  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        OmegaConf.load = original  # type: ignore[method-assign]


def _get(config: Any, key: str) -> tuple[bool, Any]:
    from omegaconf import OmegaConf

    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(config, parent_key)
    if not OmegaConf.is_dict(parent) or leaf not in parent.keys():
        return False, None
    if OmegaConf.is_missing(parent, leaf):
        return True, None  # `???`: no default, the script must set it
    return True, OmegaConf.select(config, key)


_TP_KEY = {
    "megatron": "megatron.tensor_model_parallel_size",
    "mindspeed": "mindspeed.tensor_model_parallel_size",
    "torchtitan": "torchtitan.tensor_parallel_size",
}


def truth_facts(config: Any) -> dict[str, Any]:
    """The six facts: engine (actor strategy), rollout name, worker switches, actor / rollout TP.

    FSDP-like engines (fsdp, fsdp2, veomni) have no tensor parallelism: actor TP 1."""
    facts: dict[str, Any] = {}
    strategy = _get(config, "actor_rollout_ref.actor.strategy")[1]
    facts["train_backend"] = strategy
    facts["rollout_backend"] = _get(config, "actor_rollout_ref.rollout.name")[1]
    for fact, key in (("use_legacy_worker_impl", "trainer.use_legacy_worker_impl"), ("use_v1", "trainer.use_v1")):
        present, value = _get(config, key)
        if present:
            facts[fact] = value
    tp_key = _TP_KEY.get(str(strategy))
    facts["actor_tp"] = _get(config, f"actor_rollout_ref.actor.{tp_key}")[1] if tp_key else 1
    facts["rollout_tp"] = _get(config, "actor_rollout_ref.rollout.tensor_model_parallel_size")[1]
    return facts


# --- the corpus's truth, computed once (across processes) -------------------------------------


def _corpus_key(corpus: str, release: str) -> str:
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update(fetch_wheel("verl", release).name.encode())
    for script in corpus_scripts(corpus):
        digest.update(f"{script}:{script.stat().st_size}:{script.stat().st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def corpus_truth(corpus: str) -> list[Truth]:
    """Every script of the corpus, run and composed; cached in the test cache under a file lock."""
    release = CORPORA[corpus]
    root = verl_root(release)
    key = _corpus_key(corpus, release)
    with _locked(f"truth-{corpus}") as folder:
        cached = folder / f"truth-{corpus}-{key}.json"
        if cached.is_file():
            return [_truth_from_json(item) for item in json.loads(cached.read_text())]
        with ThreadPoolExecutor(max_workers=2) as pool:  # bash in parallel, Hydra one at a time
            truths = list(pool.map(lambda script: run_script(corpus, script, root), corpus_scripts(corpus)))
        cached.write_text(json.dumps([asdict(t) for t in truths], indent=1))
        return truths


def _truth_from_json(item: dict[str, Any]) -> Truth:
    launches = [Launch(**launch) for launch in item.pop("launches")]
    return Truth(launches=launches, **item)
