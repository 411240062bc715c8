"""One reader of a run's switches, shared by every hook rlprobe-patch inserts and by `check-script`.

The hooks run this text inside verl, SGLang and vLLM-Ascend (standard library only, nothing
imported at module level beyond `os`); `rlprobe-patch check-script` runs the same functions on
the values a launch script exports, before a job is queued. A value that is not one of the
allowed spellings is an error that names the variable, the value, the allowed values and the
rank: a typo must never give a run without dumps.

- `DUMP_ON`, `PROMPTS_ONLY`: on is `1`, `true`, `yes`, `on`; off is `0`, `false`, `no`, `off`,
  empty or unset (any case, surrounding blanks ignored).
- `DUMP_PHASE`: `log_prob` (the default when unset or empty), `update_actor` or `all`.
- The msprobe config a hook would load (`MSPROBE_ACTOR_CONFIG`, `MSPROBE_SGLANG_CONFIG`, ...,
  or the hook's default when the variable is unset): a readable JSON file when dumping is on.
"""

import os

SWITCH_ON = ("1", "true", "yes", "on")
SWITCH_OFF = ("", "0", "false", "no", "off")
DUMP_PHASES = ("log_prob", "update_actor", "all")


def rlprobe_on_rank(environ=None):
    """The text " on rank N", N the rank the launcher set (`RANK`, else `LOCAL_RANK`); "" without one."""
    env = os.environ if environ is None else environ
    rank = env.get("RANK") or env.get("LOCAL_RANK")
    return f" on rank {rank}" if rank else ""


def rlprobe_switch(name, environ=None):
    """True or False for the switch `name`; ValueError naming it for any other value."""
    env = os.environ if environ is None else environ
    raw = env.get(name, "")
    word = raw.strip().lower()
    if word in SWITCH_ON:
        return True
    if word in SWITCH_OFF:
        return False
    raise ValueError(
        f"rlprobe-patch: {name}={raw!r}{rlprobe_on_rank(env)} is not a switch value: "
        f"on is one of {', '.join(SWITCH_ON)}; off is one of {', '.join(SWITCH_OFF[1:])}, "
        "empty or unset (any case)"
    )


def rlprobe_switches(environ=None):
    """The run's switches, read once: {"dump_on", "prompts_only", "phase", "warnings"}.

    Raises ValueError naming the variable for a value that is not allowed."""
    env = os.environ if environ is None else environ
    dump_on = rlprobe_switch("DUMP_ON", env)
    prompts_only = rlprobe_switch("PROMPTS_ONLY", env)
    raw_phase = env.get("DUMP_PHASE", "")
    phase = raw_phase.strip().lower() or "log_prob"
    if phase not in DUMP_PHASES:
        raise ValueError(
            f"rlprobe-patch: DUMP_PHASE={raw_phase!r}{rlprobe_on_rank(env)} is not a phase: "
            f"use one of {', '.join(DUMP_PHASES)} (log_prob when unset)"
        )
    warnings = []
    if prompts_only and not dump_on:
        warnings.append(
            "rlprobe-patch: PROMPTS_ONLY is on and DUMP_ON is off: batches are cut to their prompts "
            "before the log-prob pass and nothing is dumped"
        )
    if prompts_only and phase != "log_prob":
        warnings.append(
            f"rlprobe-patch: DUMP_PHASE={phase} under PROMPTS_ONLY: only the log-prob pass sees the "
            "prompts the rollout prefilled; update_actor steps run on prompt-only batches and pair "
            "with nothing on the rollout side"
        )
    return {"dump_on": dump_on, "prompts_only": prompts_only, "phase": phase, "warnings": warnings}


def rlprobe_config_path(variable, default, environ=None):
    """The msprobe config a hook loads: `variable`'s value, else `default`; ValueError when it
    is not a readable JSON file (the msprobe loader's own checks come after, at its creation)."""
    env = os.environ if environ is None else environ
    path = env.get(variable, "").strip()
    named = f"{variable}={path}" if path else f"{default} ({variable} is not set; this is the hook's default)"
    path = path or default
    where = f"rlprobe-patch: msprobe config {named}{rlprobe_on_rank(env)}"
    if not path or not os.path.isfile(path):
        raise ValueError(f"{where}: no such file; set {variable} to the config.json of this side")
    if not os.access(path, os.R_OK):
        raise ValueError(f"{where}: not readable by this process (uid {os.getuid()})")
    import json

    try:
        with open(path, encoding="utf-8") as config:
            data = json.load(config)
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{where}: cannot be read: {exc}") from None
    except ValueError as exc:
        raise ValueError(f"{where}: not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{where}: not a JSON object")
    return path
