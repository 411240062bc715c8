"""`detect`: the collection mode, training backend and rollout backend of a training script.

The skill's mode detector (`detect-dump-mode.sh`) greps the script. Here the same signals
(same points, same tie order: training, inference, consistency) are read from what the script
really launches (`launch.script`): Hydra overrides and the YAML files, exported switches, so
`rollout: {name: sglang}` in a YAML file counts and a commented-out `# DUMP_ON=1` does not.
The backends are not guessed from signals: they are the values verl will run with, composed by
Hydra from the tree's config (or the release defaults in the catalogue, marked as assumed).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from rlprobe_patch.base.errors import PatchError
from rlprobe_patch.base.interpreter import packages
from rlprobe_patch.catalogue.trees import find_verl_tree
from rlprobe_patch.launch.model import Script, is_true
from rlprobe_patch.launch.script import ReaderOptions, read_script
from rlprobe_patch.workflow.engines import vllm_engine
from rlprobe_patch.workflow.pairing import SGLANG_PAIRING, same_value

COLLECTION_MODES = ("training", "inference", "consistency")  # what `detect` tells apart
STAGES = ("actor_compute_log_prob", "ref_compute_log_prob", "actor_update")
ROLLOUT_BACKENDS = ("sglang", "vllm", "trtllm", "hf")
# Rollout engines verl can run that have no msprobe rollout dump (no option, no patch of ours).
UNDUMPED_ROLLOUTS = {"trtllm": "TensorRT-LLM", "hf": "Hugging Face generate"}

# The skill's hint words (SKILL.md, step 0), per mode.
HINT_WORDS: dict[str, tuple[str, ...]] = {
    "training": ("training", "训练采集", "global_profiler", "precision_debugger", *STAGES),
    "inference": ("inference", "推理采集", "rollout dump", "generate dump"),
    "consistency": ("consistency", "训推一致", "prefill 对齐", "prefill对齐"),
}


@dataclass
class Signal:
    decision: str  # "mode", "train_backend", "rollout_backend"
    value: str  # the mode or backend it points to
    points: int
    evidence: str
    where: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Detection:
    script: Script
    mode: str
    scores: dict[str, int]
    train_backend: str
    rollout_backend: str
    signals: list[Signal] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    # An SGLang rollout: each setting rid pairing needs, with the script's value (see pairing.py).
    pairing: list[dict[str, Any]] = field(default_factory=list)

    def signals_for(self, decision: str) -> list[Signal]:
        return [s for s in self.signals if s.decision == decision]


def _hint_signals(hint: str) -> list[Signal]:
    signals: list[Signal] = []
    text = hint.strip().lower()
    if not text:
        return signals
    for mode, words in HINT_WORDS.items():
        if text == mode:
            signals.append(Signal("mode", mode, 10, f"hint is {mode!r}", "--hint"))
            continue
        for word in words:
            if word.lower() in text:
                signals.append(Signal("mode", mode, 10, f"hint mentions {word!r}", "--hint"))
                break
    return signals


def _mode_signals(script: Script) -> list[Signal]:
    signals: list[Signal] = []
    # training: +8 precision_debugger tool, +4 stage names, +3 stages / profiler.enable=True
    tool = script.get("global_profiler.tool")
    if tool is not None and tool.value == "precision_debugger":
        signals.append(Signal("mode", "training", 8, "global_profiler.tool=precision_debugger", tool.source))
    else:
        for s in script.find("tool"):
            if s.value == "precision_debugger":
                signals.append(Signal("mode", "training", 8, f"{s.key}=precision_debugger", s.source))
                break
    stage_settings = [s for s in script.settings.values() if _mentions_stage(s.value)]
    if stage_settings:
        s = stage_settings[0]
        signals.append(Signal("mode", "training", 4, f"stage names in {s.key}", s.source))
    stages = script.find("precision_debugger.stages")
    enabled = [s for s in script.find("profiler.enable") if is_true(s.value)]
    if stages or enabled:
        s = (stages or enabled)[0]
        signals.append(Signal("mode", "training", 3, f"{s.key}={s.value}", s.source))

    # inference: +6 a dump config for the rollout, +2 enforce_eager=True
    dump_configs = [
        s
        for s in script.settings.values()
        if s.key.rsplit(".", 1)[-1] in ("dump_config_path", "msprobe_dump_config", "dump_config")
        and "engine_kwargs" in s.key
    ]
    cli_flag = re.search(r"--(sglang-)?msprobe[-_]dump[-_]config", script.code_text())  # slime: --sglang-*
    if dump_configs:
        s = dump_configs[0]
        signals.append(Signal("mode", "inference", 6, f"{s.key}={s.value}", s.source))
    elif cli_flag:
        signals.append(Signal("mode", "inference", 6, "--msprobe-dump-config on a command line", "script"))
    eager = script.get("rollout.enforce_eager")
    if eager is not None and is_true(eager.value):
        signals.append(Signal("mode", "inference", 2, f"{eager.key}=True", eager.source))

    # consistency: +8 DUMP_ON / PROMPTS_ONLY, +5 dispatch/update logs, +5 words, +5 combination
    switches = {name: script.env.get(name) for name in ("DUMP_ON", "PROMPTS_ONLY")}
    code = script.code_text()
    on = [name for name, s in switches.items() if s is not None and is_true(s.value)]
    used = [name for name in ("DUMP_ON", "PROMPTS_ONLY") if name not in on and re.search(rf"\b{name}\b", code)]
    if on:
        first = switches[on[0]]
        assert first is not None
        signals.append(Signal("mode", "consistency", 8, f"{' and '.join(on)} set", first.source))
    elif used:
        signals.append(Signal("mode", "consistency", 8, f"{used[0]} used in the script", "script"))
    for name, setting in switches.items():
        if setting is not None and not is_true(setting.value):
            signals.append(Signal("mode", "consistency", 0, f"{name}={setting.value} (off)", setting.source))
    if re.search(r"dispatch_log|update_actor_log", code):
        signals.append(Signal("mode", "consistency", 5, "dispatch_log / update_actor_log named", "script"))
    words = re.search(r"训推一致|consistency|prefill.*对齐", script.text, re.I)
    if words:
        line = script.text.count("\n", 0, words.start()) + 1
        signals.append(Signal("mode", "consistency", 5, f"the words {words.group(0)!r}", f"line {line}"))
    if on or used:
        prompts_only = "PROMPTS_ONLY" in on or "PROMPTS_ONLY" in used
        dump_on = "DUMP_ON" in on or "DUMP_ON" in used
        if dump_on and (dump_configs or cli_flag or prompts_only):
            other = "PROMPTS_ONLY" if prompts_only else "a rollout dump config"
            signals.append(Signal("mode", "consistency", 5, f"DUMP_ON together with {other}", "script"))
    return signals


def _mentions_stage(value: Any) -> bool:
    if isinstance(value, list):
        return any(_mentions_stage(v) for v in value)
    return isinstance(value, str) and any(stage in value for stage in STAGES)


HOOKED_ENGINES = ("fsdp", "fsdp2", "megatron")


def _fact_signal(script: Script, decision: str, fact: str) -> Signal | None:
    found = script.facts.get(fact)
    if found is None or found.value in (None, "", "???"):
        return None
    return Signal(decision, str(found.value).lower(), 10, f"{fact} = {found.value}", found.source)


def _train_backend(script: Script) -> tuple[str, list[Signal], list[str]]:
    """The engine verl will run: Hydra's composed value (with a tree) or the overrides on the release defaults."""
    signal = _fact_signal(script, "train_backend", "train_backend")
    if signal is None:
        return "unknown", [], []
    notices = []
    if signal.value not in HOOKED_ENGINES:
        notices.append(
            f"training engine {signal.value}: it runs its own training loop, the engine hooks (fsdp, megatron) "
            "do not fire there"
        )
    return signal.value, [signal], notices


def _rollout_backend(script: Script) -> tuple[str, list[Signal]]:
    signal = _fact_signal(script, "rollout_backend", "rollout_backend")
    if signal is None:
        return "unknown", []
    if signal.value not in ROLLOUT_BACKENDS:
        return "unknown", [replace(signal, points=0, evidence=f"{signal.evidence} (not a known backend)")]
    return signal.value, [signal]


def undumped_rollout(backend: str) -> str:
    """What a rollout engine without an msprobe dump means for the collection modes."""
    return (
        f"rollout backend {backend} ({UNDUMPED_ROLLOUTS[backend]}): no msprobe rollout dump exists for it, "
        "so inference and consistency collection cannot run (vllm or sglang only); "
        "training mode (verl's precision_debugger) does not dump the rollout and still works"
    )


def sglang_pairing(script: Script, mode: str) -> tuple[list[dict[str, Any]], list[str]]:
    """What check-dump needs from an SGLang rollout, against what the script runs with."""
    rows = []
    for need in SGLANG_PAIRING:
        found = script.settings.get(need.key)
        value = None if found is None else found.value
        rows.append(
            {
                "key": need.key,
                "wanted": need.value,
                "found": value,
                "source": None if found is None else found.source,
                "ok": value is not None and same_value(value, need.value),
                "why": need.why,
            }
        )
    missing = [row["key"].rsplit(".", 1)[-1] for row in rows if not row["ok"]]
    notices = []
    if missing and mode == "consistency":
        notices.append(
            f"SGLang rollout: check-dump pairs prefills with actor steps by rid only with {', '.join(missing)} "
            "set as listed (one request per prefill pass, no radix cache, no chunked prefill, no CUDA graphs); "
            "`rlprobe-patch script --mode consistency` sets them, `rlprobe-patch config --mode consistency "
            "--side generate --rollout-backend sglang` writes the generate config (step [])"
        )
    return rows, notices


def detect_script(path: Path, hint: str = "", options: ReaderOptions = ReaderOptions()) -> Detection:
    """The collection mode and the backends of the run `path` launches, read with `options`, each with its
    signals; `hint` is the user's words about the run (`--hint`)."""
    script = read_script(path, options)
    own = {k: v for k, v in script.settings.items() if not v.source.startswith("verl default")}
    signals = _hint_signals(hint) + _mode_signals(replace(script, settings=own))  # what the script sets
    scores = {
        mode: sum(s.points for s in signals if s.decision == "mode" and s.value == mode) for mode in COLLECTION_MODES
    }
    best = max(scores.values())
    mode = next(m for m in COLLECTION_MODES if scores[m] == best) if best > 0 else "unknown"
    train_backend, train_signals, notices = _train_backend(script)
    rollout_backend, rollout_signals = _rollout_backend(script)
    notices += script.notes
    if script.composed is not None and script.composed.searchpath_note:
        notices.append(script.composed.searchpath_note)
    pairing: list[dict[str, Any]] = []
    if rollout_backend == "sglang":
        pairing, pairing_notices = sglang_pairing(script, mode)
        notices += pairing_notices
    if rollout_backend in UNDUMPED_ROLLOUTS:
        notices.append(undumped_rollout(rollout_backend))
    return Detection(
        script=script,
        mode=mode,
        scores=scores,
        train_backend=train_backend,
        rollout_backend=rollout_backend,
        signals=signals + train_signals + rollout_signals,
        notices=notices,
        pairing=pairing,
    )


def cwd_dependent(script: Script) -> bool:
    """Hydra refused for what it looks for relative to the folder the script runs in (its entry point, its
    config folder, a relative search path), not for an override: the fix is where it runs (`--cwd`)."""
    composed = script.composed
    if composed is None or not composed.errors:
        return False
    return bool(script.missing_in_cwd or composed.unresolved_searchpath) or any(
        "Primary config directory not found" in error for error in composed.errors
    )


def refusal_hint(script: Script) -> str:
    """What to pass when neither backend could be read: where it runs, or what it reads from outside."""
    composed = script.composed
    if script.cwd_hint:
        return script.cwd_hint
    if composed is not None and composed.unresolved_searchpath:
        entries = ", ".join(f"file://{entry}" for entry in composed.unresolved_searchpath)
        return (
            f"{composed.config_file} searches {entries}, relative to the folder verl runs in, and neither that "
            "folder nor --verl-root's holds it: say where it runs with --cwd DIR (a verl checkout)"
        )
    if cwd_dependent(script):
        return "the script names its config relative to the folder it runs in: say where it runs with --cwd DIR"
    return "--env / --arg give what it reads from its environment and its arguments"


def found_trees(python: str | None) -> dict[str, Any]:
    """verl (our tree finder) and the other packages (find_spec + metadata) in `python`."""
    result: dict[str, Any] = {}
    try:
        found, info = packages(python)
    except PatchError as exc:
        return {"error": exc.message}
    result["python"] = info
    try:
        tree = find_verl_tree(None, python)
        result["verl"] = {"found": True, **tree.to_json()}
    except PatchError as exc:
        result["verl"] = {"found": False, "reason": exc.message}
    for name in ("sglang", "vllm", "vllm_ascend", "msprobe", "torch"):
        result[name] = found[name].to_json()
    if found["vllm"].found or found["vllm_ascend"].found:
        engine = vllm_engine(found, python)
        result["vllm_engine"] = {**engine.to_json(), "says": engine.describe()}
    return result
