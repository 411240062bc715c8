"""verl (`python3 -m verl.trainer.main_ppo key=value ...`): what a collection script needs, derived and checked.

The derived script keeps the user's launch and appends our Hydra overrides after the user's own
(Hydra applies them in order), with the switches exported before it. What is set, and why
(research/skill_and_msprobe.md section 6):

- batch: `train_batch_size`, `ppo_mini_batch_size`, `ppo_micro_batch_size_per_gpu` and the
  log-prob micro batches 1, `rollout.n` = DP, `agent.num_workers` = 1; one training step;
- flags: remove padding on, dynamic batch and balance off, no validation before training,
  rollout skip off, rollout-correction off, SP forced to 1 (with a notice);
- eager rollout and `TORCHDYNAMO_DISABLE=1`; the dump config argument of the rollout backend
  and release (vLLM-Ascend `dump_config_path`, `dump_config` before it; SGLang with native msprobe
  `msprobe_dump_config`, older SGLang needs its ModelRunner patch);
- alignment, refused when it cannot hold: FSDP rollout TP = rollout GPU count and rollout DP
  1; Megatron TP/PP/EP equal between actor, ref and rollout; vLLM rollout PP > 1;
- training mode: verl's own precision_debugger profiler, per stage.
"""

from __future__ import annotations

import datetime as dt
import re
import shlex
from typing import Any

from packaging.version import Version

from rlprobe_patch.base.errors import RefusedError
from rlprobe_patch.catalogue.releases import releases
from rlprobe_patch.launch.hydra_compose import ACTOR, FACT_KEYS, REF, ROLLOUT
from rlprobe_patch.launch.model import Script, Setting, is_true
from rlprobe_patch.workflow.derive.base import (
    Change,
    Framework,
    Requirements,
    RunOptions,
    ScriptCheck,
    hydra_text,
    shared_switches,
    version_or_none,
)
from rlprobe_patch.workflow.detect import UNDUMPED_ROLLOUTS, Detection, undumped_rollout
from rlprobe_patch.workflow.engines import COMMUNITY, VllmEngine
from rlprobe_patch.workflow.pairing import SGLANG_PAIRING, VLLM_BATCHED_TOKENS, VLLM_MODEL_LEN, VLLM_PAIRING


def same_override_value(current: Any, wanted: Any) -> bool:
    def norm(v: Any) -> str:
        if isinstance(v, str) and v.strip().lower() in ("null", "none", "~"):
            return "null"
        return hydra_text(v).strip().lower()

    return norm(current) == norm(wanted)


CAPTURE_SWITCHES = ("MISMATCH_ON", "MISMATCH_DIR")


def capture_checks(script: Script, reader: Any) -> list[ScriptCheck]:
    """The log-prob capture's switches (`MISMATCH_ON`, `MISMATCH_DIR`), checked by the hooks' own reader
    when the script exports one, and, with the capture on, what it needs of the run: rollout
    log-probs (`calculate_log_probs`) and no bypass mode, else it stops at the first step."""
    exported = {name: script.env[name] for name in (*CAPTURE_SWITCHES, "PROMPTS_ONLY") if name in script.env}
    if not any(name in exported for name in CAPTURE_SWITCHES):
        return []
    unknown = [
        name for name in exported if (f := script.launch.env.get(name) if script.launch else None) and not f.exact
    ]
    if unknown:
        return [ScriptCheck("log-prob capture", True, f"{', '.join(unknown)} set by the run: not checked", True)]
    values = {name: str(s.value) for name, s in exported.items()}
    try:
        capture = reader._rlprobe_capture_switches(values)
    except ValueError as exc:
        name = "MISMATCH_ON" if "MISMATCH_ON" in str(exc) else "MISMATCH_DIR"
        return [
            ScriptCheck(f"{name} value", False, f"{exported[name].source}: {str(exc).removeprefix('rlprobe-patch: ')}")
        ]
    checks = [
        ScriptCheck("log-prob capture", True, w.removeprefix("rlprobe-patch: "), True) for w in capture["warnings"]
    ]
    if not capture["on"]:
        return checks
    calculate = script.settings.get(f"{ROLLOUT}.calculate_log_probs")
    where = "not set (verl's default False)"
    fact = script.facts.get("calculate_log_probs")  # the release's default where the script leaves it
    if calculate is None and fact is not None:
        calculate = Setting(f"{ROLLOUT}.calculate_log_probs", fact.value, fact.source)
        where = f"not set (verl's default {fact.value}: {fact.source})"
    elif calculate is not None:
        where = f"is {calculate.value} at {calculate.source}"
    name = f"log-prob capture: {ROLLOUT}.calculate_log_probs=True"
    if calculate is None or not is_true(calculate.value):
        checks.append(
            ScriptCheck(name, False, f"{where}: the batches hold no rollout_log_probs; the capture stops at step 1")
        )
    else:
        checks.append(ScriptCheck(name, True, calculate.source))
    bypass = script.settings.get("algorithm.rollout_correction.bypass_mode")
    if bypass is not None and is_true(bypass.value):
        checks.append(
            ScriptCheck(
                "log-prob capture: algorithm.rollout_correction.bypass_mode=False",
                False,
                f"is {bypass.value} at {bypass.source}: old_log_probs are the rollout's own; "
                "the capture stops at step 1",
            )
        )
    checks.append(ScriptCheck("log-prob capture", True, f"MISMATCH_DIR {capture['dir']}"))
    _, relative = reader._rlprobe_rollout_record_dir(capture)  # the rollout engine's record needs it absolute
    if relative is not None:
        checks.append(
            ScriptCheck("log-prob capture: rollout record", True, relative.removeprefix("rlprobe-patch: "), True)
        )
    return checks


def _is_dump_arg(key: str) -> bool:
    """A rollout dump config override (`_rollout_dump_arg`)."""
    return "engine_kwargs" in key and key.rsplit(".", 1)[-1] in (
        "dump_config_path",
        "dump_config",
        "msprobe_dump_config",
    )


def _capture_run_checks(script: Script, configs: dict[str, str]) -> list[ScriptCheck]:
    """The capture run compares whole responses and dumps nothing."""
    checks = []
    cut = script.env.get("PROMPTS_ONLY")
    if cut is not None and is_true(cut.value):
        checks.append(
            ScriptCheck(
                "capture run: PROMPTS_ONLY unset",
                False,
                f"is {cut.value!r} at {cut.source}: the batches are cut to their prompts, no response token is left to "
                "compare (that is the dump run's switch)",
            )
        )
    if "generate" in configs:
        checks.append(
            ScriptCheck(
                "capture run: no rollout dump config",
                False,
                f"{configs['generate']}: the rollout would dump every pass of the capture run too (the dump run's)",
            )
        )
    return checks


def _int(script: Script, key: str, default: int | None) -> tuple[int | None, str]:
    """The value the run gets for `key`: the script's (or the tree's config), else the release default."""
    setting = script.settings.get(key)
    if setting is None:
        fact = next((script.facts[f] for f, keys in FACT_KEYS.items() if key in keys and f in script.facts), None)
        if fact is None or fact.value is None:
            return default, f"{key} not set (verl's default {default})"
        setting = Setting(key, fact.value, fact.source)
    try:
        return int(setting.value), f"{key}={setting.value} ({setting.source})"
    except (TypeError, ValueError):
        return None, f"{key}={setting.value!r} ({setting.source}) is not a number"


def _default_of(script: Script, key: str) -> str:
    """`: verl's default V (source)` where the release data knows what the run gets for an unset `key`."""
    fact = next((script.facts[f] for f, keys in FACT_KEYS.items() if key in keys and f in script.facts), None)
    return "" if fact is None or fact.value is None else f": {hydra_text(fact.value)} by default ({fact.source})"


def _set_by_script(script: Script, key: str) -> bool:
    setting = script.settings.get(key)
    return setting is not None and not setting.source.startswith(("verl default", "assumed"))


def _fact(script: Script, fact: str, key: str) -> Any:
    """The value the run gets for `key`: the script's or the tree's config, else the release default."""
    setting = script.settings.get(key)
    if setting is not None:
        return setting.value
    found = script.facts.get(fact)
    return None if found is None else found.value


def roles_of(script: Script) -> dict[str, str]:
    """The roles this run has, each with the reason, as verl decides them
    (`need_reference_policy` and `need_critic` in verl/trainer/ppo/utils.py)."""
    roles = {"actor": "every PPO run has an actor"}
    kl_reward = _fact(script, "use_kl_in_reward", "algorithm.use_kl_in_reward")
    kl_loss = _fact(script, "use_kl_loss", f"{ACTOR}.use_kl_loss")
    if is_true(kl_reward) or is_true(kl_loss):
        roles["ref"] = "a KL term (algorithm.use_kl_in_reward or actor.use_kl_loss) needs the reference model"
    critic = _fact(script, "critic_enable", "critic.enable")
    estimator = _fact(script, "adv_estimator", "algorithm.adv_estimator")
    if critic is not None and str(critic).lower() not in ("null", "none"):
        if is_true(critic):
            roles["critic"] = "critic.enable=True"
    elif str(estimator).lower() == "gae":
        roles["critic"] = "algorithm.adv_estimator=gae needs a critic (critic.enable unset)"
    return roles


def _training(
    req: Requirements, script: Script, versions: dict[str, str | None], stages: tuple[str, ...], save_path: str | None
) -> None:
    data = releases("verl")
    verl = version_or_none(versions.get("verl"))
    if verl is not None and not data.has("precision_debugger", verl):
        req.refusals.append(
            f"verl {verl} has no precision_debugger profiler (verl {data.cutoff('precision_debugger')}); "
            "use --mode consistency (engine hook) on this release"
        )
        return
    release = verl if verl is not None else Version(data.assume_when_unknown)
    known = {stage.name: stage for stage in data.stages_of(release)}
    roles = roles_of(script)
    if not stages:  # the stages this run has, that dump on its release
        stages = tuple(name for name, stage in known.items() if stage.role in roles and stage.dumps_on(release))
        idle = [name for name, stage in known.items() if stage.role in roles and not stage.dumps_on(release)]
        req.notices.append(
            f"stages: {', '.join(stages)}, the ones this run has ("
            + "; ".join(f"{role}: {why}" for role, why in roles.items())
            + ")"
            + (f"; left out, since verl {release} dumps nothing for them: {', '.join(idle)}" if idle else "")
        )
    unknown = [s for s in stages if s not in known]
    if unknown:
        req.refusals.append(f"unknown stages {unknown}; verl {release} knows: {', '.join(known)}")
        return
    for name in stages:
        stage = known[name]
        if stage.role not in roles:
            req.refusals.append(
                f"stage {name}: this run has no {stage.role.replace('_', ' ')} (verl would not run the stage)"
            )
        elif not stage.dumps_on(release):
            req.notices.append(
                f"stage {name}: verl {release} accepts it, but none of its worker methods runs under it: "
                "nothing is dumped for it"
            )
    req.add("global_profiler.tool", "precision_debugger", "verl's own msprobe integration (no source patch)")
    steps = script.settings.get("global_profiler.steps")
    if steps is None or not steps.value:
        req.add("global_profiler.steps", [1], "the steps to profile")
    if save_path:
        req.add("global_profiler.save_path", save_path, "where each stage's dump goes (step_N/<stage>)")
    config = req.configs.get("training")
    if config:
        req.add("global_profiler.global_tool_config.precision_debugger.config_path", config, "the msprobe config")
    req.add("global_profiler.global_tool_config.precision_debugger.stages", list(stages), "the stages to dump")
    for enable in dict.fromkeys(known[name].enable for name in stages if known[name].enable):
        names = [name for name in stages if known[name].enable == enable]
        req.add(enable, True, f"{', '.join(names)} run only where this role's profiler is on")


def _community_vllm(req: Requirements, engine: VllmEngine, python: str | None) -> None:
    """Community vLLM reads the rollout's dump config only through the catalogue's patch: check that the
    run's vLLM has the patches this mode needs (a failing check-script names the apply that fixes it)."""
    missing = engine.missing(req.mode)
    fix = f"rlprobe-patch apply --python {shlex.quote(python)} --only {','.join(missing)}" if python else ""
    if engine.root is None:
        where = "--vllm-root SITE_PACKAGES (where the run's vLLM is installed)"
        req.notices.append(
            f"community vLLM {engine.version or '?'}: its model runner reads additional_config.dump_config_path only "
            f"with {', '.join(engine.needed(req.mode))} applied: rlprobe-patch apply {where} "
            f"--only {','.join(engine.needed(req.mode))}; pass --python to have it checked"
        )
        return
    name = f"community vLLM {engine.version}: {', '.join(engine.needed(req.mode))} applied"
    if missing:
        states = ", ".join(f"{pid} {engine.states.get(pid, 'unknown')}" for pid in missing)
        # without the dumper nothing is dumped; without the others, what check-dump and report join the dumps by
        what = "would dump nothing" if engine.dumper() in missing else "would lack what the dumps are joined by"
        req.checks.append(ScriptCheck(name, False, f"{states} in {engine.root}: the rollout {what}; fix: {fix}"))
        req.notices.append(f"community vLLM {engine.version} in {engine.root} dumps nothing yet: {fix}")
    else:
        req.checks.append(ScriptCheck(name, True, str(engine.root)))


def _rollout_dump_arg(req: Requirements, versions: dict[str, str | None], options: RunOptions) -> None:
    config = req.configs.get("generate")
    backend = req.rollout_backend
    engine = options.vllm_engine
    if backend == "vllm" and engine is not None and engine.kind == COMMUNITY:
        if config:
            req.add(
                f"{ROLLOUT}.engine_kwargs.vllm.additional_config.dump_config_path",
                config,
                f"community vLLM {engine.version or '?'} reads it through {VllmEngine.dumper()}",
                create=True,
            )
        _community_vllm(req, engine, options.python)
    elif backend == "vllm":
        ascend = version_or_none(versions.get("vllm_ascend"))
        old = ascend is not None and not releases("vllm_ascend").has("dump_config_path", ascend)
        key = "dump_config" if old else "dump_config_path"
        if ascend is None:
            req.notices.append(
                "vLLM engine unknown (no --python environment with vLLM, no --vllm-version / --vllm-ascend-version): "
                "using additional_config.dump_config_path, which vLLM-Ascend 0.13+ reads, and community vLLM only "
                f"with {VllmEngine.dumper()} applied (rlprobe-patch apply --vllm-root SITE_PACKAGES "
                f"--only {VllmEngine.dumper()})"
            )
        if config:
            req.add(
                f"{ROLLOUT}.engine_kwargs.vllm.additional_config.{key}", config, f"vLLM-Ascend reads {key}", create=True
            )
    elif backend == "sglang":
        sglang = version_or_none(versions.get("sglang"))
        native = releases("sglang").native
        if sglang is not None and not releases("sglang").is_native(sglang):
            req.notices.append(
                f"SGLang {sglang} has no msprobe option (SGLang {native} has): patch its ModelRunner with "
                "`rlprobe-patch apply --sglang-root ... --mode consistency` (sglang.model-runner), which reads "
                "MSPROBE_SGLANG_CONFIG (default ./config.json in the server's working directory)"
            )
            if config:
                req.env["MSPROBE_SGLANG_CONFIG"] = config
            return
        if sglang is None:
            req.notices.append(
                f"SGLang version unknown: assuming {native} (msprobe_dump_config); pass --sglang-version"
            )
        if config:
            req.add(
                f"{ROLLOUT}.engine_kwargs.sglang.msprobe_dump_config",
                config,
                f"SGLang {native} native option",
                create=True,
            )
    elif backend in UNDUMPED_ROLLOUTS:
        req.blocked = undumped_rollout(backend)
    else:
        req.refusals.append(
            "the rollout backend is unknown: set actor_rollout_ref.rollout.name or pass --rollout-backend"
        )


def _steps(req: Requirements, script: Script) -> None:
    """One step is enough to compare, unless `--set` asks for more: a replay of K prompts at one prompt per
    step (`report`'s replay command sets K). More steps still collect: check-script warns, it does not fail."""
    key, given = "trainer.total_training_steps", script.get("trainer.total_training_steps")
    if given is not None and given.source == "--set" and str(given.value).isdigit() and int(given.value) > 1:
        req.add(key, int(given.value), f"--set: {given.value} steps, one prompt each", soft=True)
    else:
        req.add(key, 1, "one step is enough to compare", soft=True)


def _disaggregation(script: Script) -> str | None:
    """The setting that turns prefill/decode disaggregation on (`rollout.disaggregation.enabled`, an SGLang
    `disaggregation_mode`), None when the run uses none."""
    for s in script.settings.values():
        on = s.key.endswith("disaggregation.enabled") and is_true(s.value)
        mode = s.key.endswith("disaggregation_mode") and str(s.value).lower() not in ("", "null", "none")
        if on or mode:
            return f"{s.key}={s.value} at {s.source}"
    return None


def _sglang_pairing(req: Requirements) -> None:
    """What check-dump needs to pair SGLang prefills with actor micro-batches by rid."""
    for setting in SGLANG_PAIRING:
        if setting.key == f"{ROLLOUT}.enforce_eager":
            continue  # set above for every rollout dump
        req.add(setting.key, setting.value, setting.why, **({"create": True} if setting.create else {}))
    req.notices.append(
        "SGLang pairing by request id needs `rlprobe-patch apply --mode consistency` on the SGLang tree "
        "(a dispatch_log.jsonl beside the dumps) and on the verl tree (the request ids kept in the training "
        "batch); `rlprobe-patch list` says from which releases each patch of the set can do it"
    )


def _vllm_pairing(req: Requirements, script: Script) -> None:
    """What check-dump needs to pair vLLM prefills with actor micro-batches by request id (the demo's vLLM
    run: one request at a time, no prefix cache, no chunked prefill), and what vLLM then needs to start:
    with chunked prefill off it refuses max_num_batched_tokens < max_model_len."""
    for setting in VLLM_PAIRING:
        req.add(setting.key, setting.value, setting.why)
    model_len, _ = _int(script, VLLM_MODEL_LEN, None)
    current = script.settings.get(VLLM_MODEL_LEN)
    if model_len is None and (current is None or current.value is None):
        # unset, verl gives vLLM the model's max_position_embeddings, which no script says
        prompt, _ = _int(script, "data.max_prompt_length", 512)
        response, _ = _int(script, "data.max_response_length", 512)
        if prompt is None or response is None:
            req.notices.append(
                f"{VLLM_MODEL_LEN} is unset and the prompt / response lengths are not known here: with chunked "
                f"prefill off vLLM needs {VLLM_BATCHED_TOKENS} >= max_model_len; set both (--set)"
            )
            return
        model_len = prompt + response
        req.add(
            VLLM_MODEL_LEN,
            model_len,
            "chunked prefill off: vLLM needs max_num_batched_tokens >= max_model_len, and an unset max_model_len "
            "is the model's max_position_embeddings; prompt + response length, what older verl releases defaulted to",
        )
    batched, _ = _int(script, VLLM_BATCHED_TOKENS, 8192)
    if model_len is not None and batched is not None and batched < model_len:
        req.add(VLLM_BATCHED_TOKENS, model_len, "chunked prefill off: vLLM refuses fewer tokens than max_model_len")


def _world(script: Script, n_gpus: int | None) -> tuple[int | None, str]:
    if n_gpus is not None:
        return n_gpus, f"--n-gpus {n_gpus}"
    per_node, why_node = _int(script, "trainer.n_gpus_per_node", 8)
    nodes, why_nodes = _int(script, "trainer.nnodes", 1)
    if per_node is None or nodes is None:
        return None, why_node if per_node is None else why_nodes
    return per_node * nodes, f"{per_node * nodes} GPUs ({why_node}; {why_nodes})"


def _alignment(req: Requirements, script: Script, train: str, world: int, world_why: str) -> int | None:
    """Check or set the parallel sizes; return DP (None when refused)."""
    rollout_tp, tp_why = _int(script, f"{ROLLOUT}.tensor_model_parallel_size", None)
    rollout_dp, dp_why = _int(script, f"{ROLLOUT}.data_parallel_size", 1)
    rollout_pp, pp_why = _int(script, f"{ROLLOUT}.pipeline_model_parallel_size", 1)
    rollout_ep, ep_why = _int(script, f"{ROLLOUT}.expert_parallel_size", 1)
    if req.rollout_backend == "vllm" and rollout_pp is not None and rollout_pp > 1:
        req.refusals.append(f"vLLM rollout with pipeline parallelism > 1 is unsupported ({pp_why})")
    if train == "fsdp":
        if rollout_tp is None or not _set_by_script(script, f"{ROLLOUT}.tensor_model_parallel_size"):
            req.add(
                f"{ROLLOUT}.tensor_model_parallel_size", world, f"FSDP: rollout TP = rollout GPU count ({world_why})"
            )
        elif rollout_tp != world:
            req.refusals.append(
                f"FSDP: rollout TP must equal the rollout GPU count so that every generate rank matches a "
                f"training rank: {tp_why}, but {world_why}"
            )
            req.fixes.append(f"--set {ROLLOUT}.tensor_model_parallel_size={world}")
            req.fixes.append(f"--n-gpus {rollout_tp}")
        if rollout_dp not in (None, 1):
            req.refusals.append(f"FSDP: rollout data parallel size must be 1 ({dp_why})")
            req.fixes.append(f"--set {ROLLOUT}.data_parallel_size=1")
        return world
    # Megatron: the same TP / PP / EP on actor, ref and rollout
    sizes: dict[str, dict[str, tuple[int | None, str]]] = {}
    for role in (ACTOR, REF):
        sizes[role] = {
            "TP": _int(script, f"{role}.megatron.tensor_model_parallel_size", 1),
            "PP": _int(script, f"{role}.megatron.pipeline_model_parallel_size", 1),
            "EP": _int(script, f"{role}.megatron.expert_model_parallel_size", 1),
        }
    sizes[ROLLOUT] = {
        "TP": (
            rollout_tp if rollout_tp is not None else 2,
            tp_why if rollout_tp is not None else "rollout TP not set (verl's default 2)",
        ),
        "PP": (rollout_pp, pp_why),
        "EP": (rollout_ep, ep_why),
    }
    keys = {
        "TP": ("megatron.tensor_model_parallel_size", "tensor_model_parallel_size"),
        "PP": ("megatron.pipeline_model_parallel_size", "pipeline_model_parallel_size"),
        "EP": ("megatron.expert_model_parallel_size", "expert_parallel_size"),
    }
    for dim in ("TP", "PP", "EP"):
        values = {role: sizes[role][dim] for role in sizes}
        if len({v for v, _ in values.values()}) > 1:
            detail = "; ".join(why for _, why in values.values())
            req.refusals.append(f"Megatron: {dim} must be equal on actor, ref and rollout: {detail}")
            target = 1 if dim == "PP" else values[ACTOR][0]
            trainer_key, rollout_key = keys[dim]
            for role, (value, _) in values.items():
                if value != target:
                    key = f"{role}.{rollout_key if role == ROLLOUT else trainer_key}"
                    req.fixes.append(f"--set {key}={target}")
    if sizes[ACTOR]["PP"][0] not in (None, 1):
        req.refusals.append(f"Megatron: pipeline parallelism must be 1 for the dump ({sizes[ACTOR]['PP'][1]})")
        for role in (ACTOR, REF):
            fix = f"--set {role}.megatron.pipeline_model_parallel_size=1"
            if fix not in req.fixes:
                req.fixes.append(fix)
    for role in (ACTOR, REF):
        req.add(f"{role}.megatron.pipeline_model_parallel_size", 1, "PP = 1 (vLLM rollout PP > 1 is unsupported)")
    for role in (ACTOR, REF):  # as SP for FSDP: each CP rank holds a part of every sequence
        key = f"{role}.megatron.context_parallel_size"
        cp, cp_why = _int(script, key, 1)
        if cp != 1 and _set_by_script(script, key):
            req.notices.append(f"{key} was {cp} ({cp_why}): forced to 1 for the dump")
        req.add(key, 1, "context parallelism splits each sequence across ranks: no rank dumps a whole prompt")
    tp = sizes[ACTOR]["TP"][0] or 1
    if world % tp:
        req.refusals.append(f"Megatron: {world_why} is not divisible by TP {tp}")
        return None
    return world // tp


def _set_change(script: Script, key: str, value: str, why: str) -> Change:
    """A value `--set` gave: "set" over the script's own override of the key (or verl's value), "kept" where
    the script already had it."""
    own = [o for o in script.overrides_of(key) if o.source != "--set"]
    if own and same_override_value(own[-1].value, value):
        return Change(key, value, why, "kept", own[-1].source, own[-1].value)
    if own:
        return Change(key, value, why, "set", f"{own[-1].source}; by --set", own[-1].value)
    return Change(key, value, why, "set", "--set (the script does not set it)")


def _token(prefix: str, key: str, value: str) -> str:
    token = f"{prefix}{key}={value}"
    return token if shlex.quote(token) == token else shlex.quote(token)


class Verl(Framework):
    """verl's launch (Hydra overrides) and hooks (`verl.*` patches)."""

    name = "verl"
    facts_shown = (
        "use_legacy_worker_impl",
        "use_v1",
        "actor_tp",
        "actor_pp",
        "rollout_tp",
        "n_gpus_per_node",
        "nnodes",
    )
    dump_config_arg = "engine_kwargs dump config"

    def requirements(self, detection: Detection, mode: str, options: RunOptions) -> Requirements:
        script, versions, n_gpus = detection.script, options.versions, options.n_gpus
        train = (options.train_backend or detection.train_backend).replace("fsdp2", "fsdp")
        rollout = options.rollout_backend or detection.rollout_backend
        req = Requirements(mode, train, rollout, configs=dict(options.configs))

        if mode == "training":
            _training(req, script, versions, options.stages, options.save_path)
            return req

        # inference and consistency: the rollout dump
        req.add(
            f"{ROLLOUT}.enforce_eager", True, "rollout dump needs eager mode (vllm-ascend < 0.20 raises without it)"
        )
        req.env["TORCHDYNAMO_DISABLE"] = "1"
        for s in script.settings.values():
            if s.key.endswith("skip.enable") or s.key.endswith("skip.rollout.enable"):
                req.add(
                    s.key,
                    False,
                    "rollout skip replays dumped rollouts: nothing would be generated",
                    only_if_present=True,
                )
        _rollout_dump_arg(req, versions, options)
        pd = _disaggregation(script)
        if rollout == "sglang" and pd is not None:
            req.notices.append(
                f"SGLang with prefill/decode disaggregation ({pd}): export SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0"
            )
        if mode == "inference":
            return req
        if rollout == "sglang":
            _sglang_pairing(req)
        elif rollout == "vllm":
            _vllm_pairing(req, script)

        # consistency: batch sizes, flags, alignment, the engine hook switches
        if train not in ("fsdp", "megatron"):
            req.refusals.append("the training backend is unknown: pass --train-backend fsdp|megatron")
            return req
        world, world_why = _world(script, n_gpus)
        if world is None:
            req.refusals.append(f"cannot tell the GPU count: {world_why}; pass --n-gpus")
            return req
        if n_gpus is not None:  # the derived script runs on the GPUs the checks assumed
            req.add("trainer.n_gpus_per_node", n_gpus, f"--n-gpus {n_gpus}: the GPU count the alignment checks used")
            req.add("trainer.nnodes", 1, f"--n-gpus {n_gpus}: on one node")
        dp = _alignment(req, script, train, world, world_why)
        for key, value, why in (
            ("data.train_batch_size", 1, "batch: one prompt per step"),
            (f"{ACTOR}.ppo_mini_batch_size", 1, "batch: one mini-batch (mini_batch_num = 1)"),
            (f"{ACTOR}.ppo_micro_batch_size_per_gpu", 1, "batch: one sample per micro-batch (gac = 1)"),
            (f"{REF}.log_prob_micro_batch_size_per_gpu", 1, "batch: one sample per log-prob micro-batch"),
            (f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu", 1, "batch: one sample per log-prob micro-batch"),
            (f"{ROLLOUT}.agent.num_workers", 1, "the agent loop only splits batches evenly"),
            ("actor_rollout_ref.model.use_remove_padding", True, "remove padding, as the engine hook expects"),
            (f"{ACTOR}.use_dynamic_bsz", False, "dynamic batch sizes regroup samples across micro-batches"),
            (f"{REF}.log_prob_use_dynamic_bsz", False, "dynamic batch sizes regroup samples"),
            (f"{ROLLOUT}.log_prob_use_dynamic_bsz", False, "dynamic batch sizes regroup samples"),
            ("trainer.balance_batch", False, "balancing reorders samples across ranks"),
            ("trainer.val_before_train", False, "validation would generate (and dump) first"),
            (
                "algorithm.use_kl_in_reward",
                False,
                "PROMPTS_ONLY cuts responses to length 0: a KL penalty in the reward would fail at the advantage step",
            ),
            ("algorithm.rollout_correction.rollout_is", None, "rollout correction off"),
            ("algorithm.rollout_correction.rollout_rs", None, "rollout correction off"),
            ("algorithm.rollout_correction.rollout_rs_threshold", None, "rollout correction off"),
            ("algorithm.rollout_correction.rollout_is_batch_normalize", False, "rollout correction off"),
        ):
            req.add(key, value, why)
        _steps(req, script)
        req.add(
            "async_training.partial_rollout",
            False,
            "a request interrupted and resumed is prefilled again with its generated tokens cached: its dumps "
            "cannot pair with the actor's",
            only_if_present=True,
        )
        if dp is not None:
            req.add(f"{ROLLOUT}.n", dp, f"rollout.n = DP = {dp}: each training rank gets one response")
        if train == "fsdp":
            for role in (ACTOR, REF):
                key = f"{role}.ulysses_sequence_parallel_size"
                current = script.settings.get(key)
                if current is not None and str(current.value) not in ("1",):
                    req.notices.append(f"{key} was {current.value} ({current.source}): forced to 1 for the dump")
                req.add(key, 1, "sequence parallelism splits the sequence across ranks; DP = world / SP")
        actor_config = req.configs.get("actor")
        req.env.update({"DUMP_ON": "1", "PROMPTS_ONLY": "1", "DUMP_PHASE": "log_prob"})
        if actor_config:
            req.env["MSPROBE_ACTOR_CONFIG"] = actor_config
        return req

    def capture_run(self, req: Requirements) -> Requirements:
        """The dump run's launch and overrides (the same prompt, the same engine settings), without the dump
        (no rollout dump config, DUMP_ON / PROMPTS_ONLY unset: whole responses), with the log-prob capture
        on (`verl.logprob-capture`: MISMATCH_ON=1, the rollout's log-probs kept)."""
        capture = Requirements(req.mode, req.train_backend, req.rollout_backend, capture=True)
        capture.settings = [r for r in req.settings if not _is_dump_arg(r.key)]
        for r in req.settings:  # the script's own rollout dump config, if it names one: off
            if _is_dump_arg(r.key):
                capture.add(r.key, None, "the capture run dumps nothing (the dump run does)", only_if_present=True)
        capture.add(f"{ROLLOUT}.calculate_log_probs", True, "the capture compares the rollout's log-probs")
        capture.add(
            "algorithm.rollout_correction.bypass_mode",
            False,
            "bypass mode makes old_log_probs the rollout's own: nothing to compare",
            only_if_present=True,
        )
        capture.env = {name: value for name, value in req.env.items() if name == "TORCHDYNAMO_DISABLE"}
        # off over the script's own exports: no dump, whole responses
        capture.env.update({"DUMP_ON": "0", "PROMPTS_ONLY": "0", "MISMATCH_ON": "1"})
        capture.pinned, capture.probes = dict(req.pinned), dict(req.probes)
        capture.notices.append(
            "the log-prob capture run: one file per training step in MISMATCH_DIR (exported as an absolute path: "
            "the trainer's folder, default rlprobe-logprobs in its working directory), and in MISMATCH_DIR/rollout "
            "vLLM's record of each request it ran (vllm.rollout-record), for rlprobe-patch report with check-dump "
            f"--compare's output; it needs {' and '.join(releases('verl').capture_patches)} applied, and on a vLLM "
            f"rollout {' and '.join(releases('vllm').capture_patches)} (all in apply --mode consistency)"
        )
        return capture

    def render(self, script: Script, req: Requirements, source_name: str, composed: bool) -> tuple[str, list[Change]]:
        """The collection script: the original, with our overrides passed after the user's own.

        Hydra applies overrides in order, so the values appended at the end of the verl launch are the
        ones the run gets, whatever the arrays, variables and `"$@"` before them hold; nothing of the
        user's is edited. `composed`: the settings are the tree's full config, so a key that is not
        there does not exist in that release (skipped unless the requirement creates it)."""
        launch = script.launch
        if launch is None:
            raise RefusedError(f"{script.path}: no verl launch found")
        if launch.run.file.resolve() != script.path.resolve():
            raise RefusedError(
                f"{script.path}: the verl launch is in {launch.run.file} (line {launch.run.line}), which it sources",
                hint=f"derive the collection script from {launch.run.file}",
            )
        changes: list[Change] = []
        appended = [shlex.quote(f.text) for f in launch.args if f.file.name == "--set"]  # the user's, first
        wanted = {r.key for r in req.settings}
        for override in script.overrides:  # a --set no requirement names: listed as what it sets
            if override.source == "--set" and override.key not in wanted:
                changes.append(_set_change(script, override.key, override.value_text, "--set KEY=VALUE"))
        for r in req.settings:
            current = script.settings.get(r.key)
            if current is None and r.only_if_present:
                continue
            if current is not None and current.source == "--set" and same_override_value(current.value, r.value):
                changes.append(_set_change(script, r.key, r.text, r.why))
                continue
            if current is not None and same_override_value(current.value, r.value):
                changes.append(Change(r.key, r.text, r.why, "kept", current.source, current.value))
                continue
            if current is None and composed and not r.create:
                changes.append(Change(r.key, r.text, r.why + " (not in this verl release's config)", "skipped"))
                continue
            appended.append(_token("" if current is not None else "++", r.key, r.text))
            action = "set" if current is not None else "added"
            changes.append(
                Change(
                    r.key,
                    r.text,
                    r.why,
                    action,
                    current.source if current else None,
                    current.value if current else None,
                )
            )
        data = script.path.read_bytes()
        edits: list[tuple[int, bytes]] = []
        run = launch.run
        if appended:
            line_start = data.rfind(b"\n", 0, run.start_byte) + 1
            indent = re.match(rb"[ \t]*", data[line_start:]).group(0).decode()  # type: ignore[union-attr]
            block = "".join(f" \\\n{indent}    {token}" for token in appended)
            edits.append((run.args_end_byte, block.encode()))
        line_start = data.rfind(b"\n", 0, run.start_byte) + 1
        indent = re.match(rb"[ \t]*", data[line_start:]).group(0).decode()  # type: ignore[union-attr]
        exports = [f"{indent}# rlprobe-patch: {req.mode} collection switches"]
        exports += [f"{indent}export {name}={shlex.quote(value)}" for name, value in req.env.items()]
        edits.append((line_start, ("\n".join(exports) + "\n").encode()))
        edits += req.probe_pins(data)
        for at, text in sorted(edits, reverse=True):
            data = data[:at] + text + data[at:]
        out = data.decode("utf-8")
        which = " (its log-prob capture run: no dump)" if req.capture else ""
        header = (
            f"# Generated by rlprobe-patch script --mode {req.mode}{which} from {source_name} "
            f"on {dt.date.today().isoformat()}; the original is unchanged.\n"
            f"# training backend: {req.train_backend}, rollout backend: {req.rollout_backend}\n"
        )
        header = req.header(header)
        if out.startswith("#!"):
            nl = out.find("\n") + 1
            out = out[:nl] + header + out[nl:]
        else:
            out = header + out
        return out, changes

    def check(self, script: Script, req: Requirements) -> list[ScriptCheck]:
        checks = [ScriptCheck("alignment", False, reason) for reason in req.refusals]
        for r in req.settings:
            current = script.settings.get(r.key)
            if current is None:
                if r.only_if_present:
                    continue
                checks.append(ScriptCheck(f"{r.key}={r.text}", False, f"not set{_default_of(script, r.key)} ({r.why})"))
            elif same_override_value(current.value, r.value):
                checks.append(ScriptCheck(f"{r.key}={r.text}", True, current.source))
            else:
                detail = f"is {hydra_text(current.value)} at {current.source} ({r.why})"
                checks.append(ScriptCheck(f"{r.key}={r.text}", r.soft, detail, warning=r.soft))
        checks.extend(capture_checks(script, self.switches()))
        if req.capture:
            checks.extend(_capture_run_checks(script, self.config_paths(script, req.mode)))
        return checks

    def config_paths(self, script: Script, mode: str) -> dict[str, str]:
        found: dict[str, str] = {}
        if mode == "consistency" and "MSPROBE_ACTOR_CONFIG" in script.env:
            found["actor"] = str(script.env["MSPROBE_ACTOR_CONFIG"].value)
        if mode == "training":
            s = script.get("precision_debugger.config_path")
            if s is not None and s.value:
                found["training"] = str(s.value)
        else:
            for leaf in ("dump_config_path", "msprobe_dump_config", "dump_config"):
                for s in script.find(leaf):
                    if "engine_kwargs" in s.key and isinstance(s.value, str):
                        found["generate"] = s.value
        return found

    def switches(self) -> Any:
        return shared_switches()
