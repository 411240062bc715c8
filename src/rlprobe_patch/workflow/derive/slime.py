"""slime (`python3 train.py`): what a collection script needs, derived and checked.

A collection script for slime (`--mode consistency`, `--mode inference`) sets, each with its
reason:

- the switches of our hooks (the slime actor and rollout patches): `DUMP_ON=1`,
  `DUMP_PHASE` in slime's list grammar (`log_prob`), `MSPROBE_ACTOR_CONFIG`, and
  `TORCHDYNAMO_DISABLE=1` (slime compiles parts of its loss; msprobe refuses TorchDynamo);
  `PROMPTS_ONLY` is not set: slime's hooks do not cut batches to their prompts;
- alignment: one sample per micro-batch (`--micro-batch-size 1`, no `--use-dynamic-batch-size`),
  no `--balance-data` (it reorders samples across ranks), one rollout, the log-prob pass kept
  (`--get-mismatch-metrics`: slime skips that pass when the loss can reuse the log-probs), no
  evaluation (eval samples restart their indices at 0, so their request ids collide), SGLang in
  eager mode with no radix cache, no chunked prefill and one request at a time, pipeline
  parallelism 1 and the same tensor parallel size for the actor and each SGLang engine;
- the rollout's dump config: `--sglang-msprobe-dump-config` (SGLang with native msprobe), or
  `MSPROBE_SGLANG_CONFIG` for the `sglang.model-runner` patch of older SGLang.

Switches (`--flag` with no value) that must be off are removed from the derived script at the
word that sets them; values are appended after the launch's own (argparse keeps the last). The
flags are read by `launch.slime_args`.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from rlprobe_patch.base.errors import RefusedError
from rlprobe_patch.catalogue.releases import releases
from rlprobe_patch.launch.model import Script
from rlprobe_patch.launch.shell import Field
from rlprobe_patch.launch.slime_args import FACT_FLAGS, flag_occurrences
from rlprobe_patch.workflow.derive.base import (
    Change,
    Framework,
    Requirements,
    RunOptions,
    ScriptCheck,
    load_shared,
    shared_switches,
    version_or_none,
)
from rlprobe_patch.workflow.detect import Detection


def _int_fact(script: Script, fact: str) -> tuple[int | None, str]:
    found = script.facts.get(fact)
    if found is None:
        return None, f"{fact} unknown"
    flag = next(name for f, name, _, _ in FACT_FLAGS if f == fact)
    if not all(f.exact for f in flag_occurrences(script, flag)[-1:]):
        return None, f"--{flag} {found.value} ({found.source})"
    try:
        return int(found.value), f"--{flag} {found.value} ({found.source})"
    except (TypeError, ValueError):
        return None, f"--{flag} {found.value!r} ({found.source}) is not a number"


def _same(current: Any, wanted: Any) -> bool:
    if wanted is False:
        return current is None
    if wanted is True:
        return current is True
    return current is not None and str(current) == str(wanted)


def _word_edit(script: Script, data: bytes, starts: list[int], word: Field, flag: str) -> tuple[int, int, bytes]:
    """The span of `word` on the line it was written on, to remove it from the derived script."""
    where = f"{word.file.name}:{word.line}"
    if word.file.name in ("--arg", "--set", "--env") or word.file.resolve() != script.path.resolve():
        raise RefusedError(
            f"{script.path}: --{flag} must be off for the dump, and it is set at {where}, outside the script",
            hint=f"remove --{flag} there (or from the arguments given), then derive again",
        )
    line_start = starts[word.line - 1]
    line_end = data.find(b"\n", line_start)
    line = data[line_start : len(data) if line_end < 0 else line_end]
    token = word.text.encode()
    found = [m for m in re.finditer(rb"(?<![^\s\"'(=])" + re.escape(token) + rb"(?![^\s\"')])", line)]
    code = line.split(b"#", 1)[0] if not found else line
    if len(found) != 1 or b"#" in code[: found[0].start()]:
        raise RefusedError(
            f"{script.path}: --{flag} must be off for the dump, and the word {word.text!r} at {where} "
            "cannot be told apart on its line",
            hint=f"remove --{flag} at {where}, then derive again",
        )
    return line_start + found[0].start(), line_start + found[0].end(), b""


def _exports_at(script: Script, data: bytes) -> int:
    """Where the switches go: before `ray start` (Ray workers inherit the raylet's environment), else the launch."""
    assert script.launch is not None
    at = script.launch.run.start_byte
    for run in script.reading.runs:
        words = [f.text for f in run.argv[:2]]
        if (
            run.file.resolve() == script.path.resolve()
            and words
            and Path(words[0]).name == "ray"
            and words[1:] == ["start"]
        ):
            at = min(at, run.start_byte)
    return data.rfind(b"\n", 0, at) + 1


class Slime(Framework):
    """slime's launch, flags and hooks (`slime.*` patches)."""

    name = "slime"
    facts_shown = tuple(fact for fact, *_ in FACT_FLAGS)
    dump_config_arg = "--sglang-msprobe-dump-config"

    def requirements(self, detection: Detection, mode: str, options: RunOptions) -> Requirements:
        configs, versions, n_gpus = options.configs, options.versions, options.n_gpus

        script = detection.script
        train = str(script.fact("train_backend", "megatron"))
        req = Requirements(mode, train, "sglang", configs=dict(configs))
        if mode == "training":
            req.refusals.append(
                "slime has no msprobe integration of its own (verl's precision_debugger): use --mode consistency "
                "(the slime.megatron-actor hook) or --mode inference"
            )
            return req
        req.env["TORCHDYNAMO_DISABLE"] = "1"
        req.add(
            "sglang-disable-cuda-graph", True, "eager SGLang: a captured CUDA graph replays without msprobe's hooks"
        )
        generate = configs.get("generate")
        sglang = version_or_none(versions.get("sglang"))
        native = releases("sglang").native
        if sglang is not None and not releases("sglang").is_native(sglang):
            req.notices.append(
                f"SGLang {sglang} has no msprobe option (SGLang {native} has; slime 0.2.x ships 0.5.5-0.5.9): patch "
                "its ModelRunner with `rlprobe-patch apply --sglang-root ... --mode consistency` "
                "(sglang.model-runner), which reads MSPROBE_SGLANG_CONFIG"
            )
            if generate:
                req.env["MSPROBE_SGLANG_CONFIG"] = generate
        else:
            if sglang is None:
                req.notices.append(
                    f"SGLang version unknown: assuming SGLang {native} (as slime 0.3.x ships), whose msprobe option "
                    "slime passes on as --sglang-msprobe-dump-config; for older SGLang pass --sglang-version"
                )
            if generate:
                req.add(
                    "sglang-msprobe-dump-config", generate, f"SGLang {native} native option, through slime's --sglang-*"
                )
        if mode == "inference":
            return req

        if train != "megatron":
            req.refusals.append(f"slime training backend {train}: the slime.megatron-actor hook runs in Megatron only")
            return req
        for name, value, why in (
            ("micro-batch-size", "1", "one sample per micro-batch: one msprobe step per sample, paired by request id"),
            ("use-dynamic-batch-size", False, "dynamic batching packs samples by token count into micro-batches"),
            ("balance-data", False, "balancing reorders samples across data-parallel ranks"),
            ("num-rollout", "1", "one rollout is enough to compare"),
            ("num-steps-per-rollout", "1", "one training step: the update runs on the rollout's weights"),
            (
                "get-mismatch-metrics",
                True,
                "keeps the actor's log-prob pass (slime skips it when the loss can reuse log-probs, or with "
                "--use-rollout-logprobs), the pass DUMP_PHASE=log_prob dumps",
            ),
            ("eval-interval", False, "no evaluation: eval samples restart their indices at 0 and reuse request ids"),
            ("skip-eval-before-train", True, "no evaluation before training (its samples reuse request ids)"),
            ("sglang-disable-radix-cache", True, "no radix cache: each prefill dumps the whole prompt"),
            ("sglang-chunked-prefill-size", "-1", "no chunked prefill: each prompt is prefilled in one pass, one dump"),
            ("sglang-max-running-requests", "1", "one request per prefill pass (a batched prefill cannot be paired)"),
            ("pipeline-model-parallel-size", "1", "PP = 1: steps on other stages cover part of the model only"),
        ):
            req.add(name, value, why)
        tp, tp_why = _int_fact(script, "actor_tp")
        rollout_tp, rollout_why = _int_fact(script, "rollout_tp")
        if tp is not None and rollout_tp is not None and tp != rollout_tp:
            req.refusals.append(
                f"TP must be equal on the actor and each SGLang engine (tensors are dumped per TP shard): {tp_why}; "
                f"{rollout_why}"
            )
            req.fixes.append(f"--set rollout-num-gpus-per-engine={tp}")
        cp, cp_why = _int_fact(script, "actor_cp")
        if cp not in (None, 1):
            req.notices.append(
                f"context parallelism splits each sequence across ranks ({cp_why}): the dumps hold parts"
            )
        if n_gpus is not None:
            req.add("actor-num-nodes", "1", f"--n-gpus {n_gpus}: on one node")
            req.add("actor-num-gpus-per-node", str(n_gpus), f"--n-gpus {n_gpus}: the GPU count the checks used")
            world: int | None = n_gpus
        else:
            per_node, _ = _int_fact(script, "n_gpus_per_node")
            nodes, _ = _int_fact(script, "nnodes")
            world = per_node * nodes if per_node is not None and nodes is not None else None
        if world is not None and tp is not None:
            dp = world // (tp * (cp or 1)) or 1
            req.add("rollout-batch-size", "1", "one prompt")
            req.add("n-samples-per-prompt", str(dp), f"n-samples-per-prompt = DP = {dp}: one sample per training rank")
            req.add("global-batch-size", str(dp), f"global batch = DP = {dp}: every sample in one step")
        else:
            req.notices.append(
                "the GPU count is not known before the run: batch sizes left as they are (pass --n-gpus)"
            )
        if script.launch is not None and "ray job submit" in script.launch.launcher:
            req.notices.append(
                "the switches are exported before `ray start`: with a Ray cluster started elsewhere, add them to the "
                "job's --runtime-env-json env_vars (Ray workers see the environment their raylet was started with)"
            )
        actor_config = configs.get("actor")
        req.env.update({"DUMP_ON": "1", "DUMP_PHASE": "log_prob"})
        if actor_config:
            req.env["MSPROBE_ACTOR_CONFIG"] = actor_config
        return req

    def config_paths(self, script: Script, mode: str) -> dict[str, str]:
        found: dict[str, str] = {}
        if mode == "consistency" and "MSPROBE_ACTOR_CONFIG" in script.env:
            found["actor"] = str(script.env["MSPROBE_ACTOR_CONFIG"].value)
        setting = script.settings.get("sglang-msprobe-dump-config")
        if setting is not None and isinstance(setting.value, str):
            found["generate"] = setting.value
        elif "MSPROBE_SGLANG_CONFIG" in script.env:
            found["generate"] = str(script.env["MSPROBE_SGLANG_CONFIG"].value)
        return found

    def render(self, script: Script, req: Requirements, source_name: str, composed: bool) -> tuple[str, list[Change]]:

        launch = script.launch
        assert launch is not None
        if launch.run.file.resolve() != script.path.resolve():
            raise RefusedError(
                f"{script.path}: the slime launch is in {launch.run.file} (line {launch.run.line}), which it sources",
                hint=f"derive the collection script from {launch.run.file}",
            )
        data = script.path.read_bytes()
        starts = [0] + [m.end() for m in re.finditer(rb"\n", data)]
        edits: list[tuple[int, int, bytes]] = []
        changes: list[Change] = []
        appended = [shlex.quote(f.text) for f in launch.args if f.file.name == "--set"]
        for r in req.settings:
            current = script.settings.get(r.key)
            value = None if current is None else current.value
            shown = "off" if r.value is False else ("on" if r.value is True else str(r.value))
            if _same(value, r.value):
                changes.append(Change(r.key, shown, r.why, "kept", current.source if current else None, value))
                continue
            if r.value is False:
                assert current is not None
                for flag in flag_occurrences(script, r.key):
                    for word in [flag.word] if "=" in flag.word.text else [flag.word, *flag.values]:
                        edits.append(_word_edit(script, data, starts, word, r.key))
                changes.append(Change(r.key, shown, r.why, "removed", current.source, value))
                continue
            appended.append(f"--{r.key}" if r.value is True else f"--{r.key} {shlex.quote(str(r.value))}")
            action = "set" if current is not None else "added"
            changes.append(Change(r.key, shown, r.why, action, current.source if current else None, value))
        run = launch.run
        if appended:
            line_start = data.rfind(b"\n", 0, run.start_byte) + 1
            indent = re.match(rb"[ \t]*", data[line_start:]).group(0).decode()  # type: ignore[union-attr]
            block = "".join(f" \\\n{indent}   {token}" for token in appended)
            edits.append((run.args_end_byte, run.args_end_byte, block.encode()))
        at = _exports_at(script, data)
        indent = re.match(rb"[ \t]*", data[at:]).group(0).decode()  # type: ignore[union-attr]
        exports = [f"{indent}# rlprobe-patch: {req.mode} collection switches (slime)"]
        exports += [f"{indent}export {name}={shlex.quote(value)}" for name, value in req.env.items()]
        edits.append((at, at, ("\n".join(exports) + "\n").encode()))
        edits += [(offset, offset, text) for offset, text in req.probe_pins(data)]
        for start, end, text in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
            data = data[:start] + text + data[end:]
        out = data.decode("utf-8")
        header = (
            f"# Generated by rlprobe-patch script --mode {req.mode} from {source_name}; the original is unchanged.\n"
            f"# slime launch ({Path(launch.entry).name}); training backend: {req.train_backend}, rollout: SGLang\n"
        )
        header = req.header(header)
        if out.startswith("#!"):
            nl = out.find("\n") + 1
            return out[:nl] + header + out[nl:], changes
        return header + out, changes

    def check(self, script: Script, req: Requirements) -> list[ScriptCheck]:

        checks: list[ScriptCheck] = [ScriptCheck("alignment", False, reason) for reason in req.refusals]
        for r in req.settings:
            current = script.settings.get(r.key)
            value = None if current is None else current.value
            name = (
                f"--{r.key} off" if r.value is False else (f"--{r.key}" if r.value is True else f"--{r.key} {r.value}")
            )
            if _same(value, r.value):
                checks.append(ScriptCheck(name, True, current.source if current else "not set"))
            elif current is None:
                checks.append(ScriptCheck(name, False, f"not set ({r.why})"))
            else:
                shown = "on" if value is True else value
                checks.append(ScriptCheck(name, False, f"is {shown} at {current.source} ({r.why})"))
        return checks

    def switches(self) -> Any:
        """slime's switch reader (`patches/_shared/slime_switches.py` over the shared one), as the hooks run it."""
        module = load_shared("slime_switches")
        base = type(shared_switches())
        reader = type("SlimeReader", (base,), {"_rlprobe_switches": module.SlimeSwitches._rlprobe_switches})
        return reader()
