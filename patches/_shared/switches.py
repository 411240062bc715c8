"""One reader of a run's switches, shared by every hook rlprobe-patch inserts and by `check-script`.

The methods of `Switches` are spliced, verbatim, into each hook's class (a payload line
`_rlprobe_switches = Switches._rlprobe_switches`, see
`src/rlprobe_patch/codemod/_payload_parts.py`); a hook that lives in a module-level function takes
them in a class of its own that the patch appends to the module (`_RlprobeSwitches`).
`rlprobe-patch check-script` runs the same text on the values a launch script exports, before a
job is queued (`Switches()._rlprobe_switches(env)`). Standard library only, imported inside the
methods (some target files do not import `os`); the allowed values are written out in each method
(a name in capitals would be a slot of the parts).

A value that is not one of the allowed spellings is an error that names the variable, the value,
the allowed values and the rank: a typo must never give a run without dumps.

- `DUMP_ON`, `PROMPTS_ONLY`: on is `1`, `true`, `yes`, `on`; off is `0`, `false`, `no`, `off`,
  empty or unset (any case, surrounding blanks ignored).
- `DUMP_PHASE`: `log_prob` (the default when unset or empty), `update_actor` or `all`.
- The msprobe config a hook would load (`MSPROBE_ACTOR_CONFIG`, `MSPROBE_SGLANG_CONFIG`, ...,
  or the hook's default when the variable is unset): a readable JSON object when dumping is on;
  msprobe's own loader checks it further when the debugger is made (`_rlprobe_debugger`).
- `MISMATCH_ON` (a switch, as above) and `MISMATCH_DIR` (a folder, default `rlprobe-logprobs`): the
  log-prob capture's (`_rlprobe_capture_switches`); a rollout engine records its requests in
  `MISMATCH_DIR/rollout` only when the folder is absolute (`_rlprobe_rollout_record_dir`).

The hooks read the switches once per process (`_rlprobe_run_switches`: the answer is kept in
`sys.modules["_rlprobe_patch_run"]`, shared by every hook of the process), print the warnings
once, and, when dumping is on, one line per patch from rank 0 (`_rlprobe_announce`).
"""


class Switches:
    """The switch reader: every method here is inserted as it is written."""

    def _rlprobe_on_rank(self, environ=None):
        # " on rank N", N the rank the launcher set (RANK, else LOCAL_RANK); "" without one.
        import os

        env = os.environ if environ is None else environ
        rank = env.get("RANK") or env.get("LOCAL_RANK")
        return f" on rank {rank}" if rank else ""

    def _rlprobe_switch(self, name, environ=None):
        # True or False for the switch `name`; ValueError naming it for any other value.
        import os

        env = os.environ if environ is None else environ
        raw = env.get(name, "")
        word = raw.strip().lower()
        if word in ("1", "true", "yes", "on"):
            return True
        if word in ("", "0", "false", "no", "off"):
            return False
        raise ValueError(
            f"rlprobe-patch: {name}={raw!r}{self._rlprobe_on_rank(env)} is not a switch value: "
            "on is one of 1, true, yes, on; off is one of 0, false, no, off, empty or unset (any case)"
        )

    def _rlprobe_switches(self, environ=None):
        # The run's switches: {"dump_on", "prompts_only", "phase", "warnings"}; ValueError naming
        # the variable for a value that is not allowed.
        import os

        env = os.environ if environ is None else environ
        dump_on = self._rlprobe_switch("DUMP_ON", env)
        prompts_only = self._rlprobe_switch("PROMPTS_ONLY", env)
        raw_phase = env.get("DUMP_PHASE", "")
        phase = raw_phase.strip().lower() or "log_prob"
        if phase not in ("log_prob", "update_actor", "all"):
            raise ValueError(
                f"rlprobe-patch: DUMP_PHASE={raw_phase!r}{self._rlprobe_on_rank(env)} is not a phase: "
                "use one of log_prob, update_actor, all (log_prob when unset)"
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

    def _rlprobe_config_path(self, variable, default, environ=None):
        # The msprobe config a hook loads: `variable`'s value, else `default`; ValueError when it
        # is not a readable JSON object (msprobe's own checks come after, in _rlprobe_debugger).
        import os

        env = os.environ if environ is None else environ
        path = env.get(variable, "").strip()
        named = f"{variable}={path}" if path else f"{default} ({variable} is not set; this is the hook's default)"
        path = path or default
        where = f"rlprobe-patch: msprobe config {named}{self._rlprobe_on_rank(env)}"
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

    def _rlprobe_run_switches(self):
        # The switches of this process, read at the first hook call and kept for every hook of
        # the process: a wrong value stops the run there; warnings are printed once.
        import sys

        run = sys.modules.get("_rlprobe_patch_run")
        if run is None:
            import types

            switches = self._rlprobe_switches()
            for warning in switches["warnings"]:
                print(warning, file=sys.stderr, flush=True)
            run = types.ModuleType("_rlprobe_patch_run", "rlprobe-patch: the switches this process runs with")
            run.switches = switches
            run.announced = set()
            sys.modules["_rlprobe_patch_run"] = run
        return run.switches

    def _rlprobe_debugger(self, variable, config_path):
        # msprobe's debugger for `config_path`; its loader's refusal names the variable and the file.
        from msprobe.pytorch import PrecisionDebugger, seed_all

        seed_all(mode=True)
        try:
            return PrecisionDebugger(config_path=config_path)
        except Exception as exc:
            # msprobe marks its one instance initialized before checking: never leave a half-made one.
            PrecisionDebugger._instance = None
            raise ValueError(
                f"rlprobe-patch: msprobe config {variable}={config_path}{self._rlprobe_on_rank()}: "
                f"msprobe refuses it: {exc}"
            ) from exc

    def _rlprobe_announce(self, patch, rank, config_path, dump_path):
        # One line per patch and process when dumping is on, from rank 0 only, at the first hook call.
        import sys

        switches = self._rlprobe_run_switches()
        run = sys.modules["_rlprobe_patch_run"]
        if patch in run.announced or rank not in (0, "0", None):
            return
        run.announced.add(patch)
        print(
            f"rlprobe-patch: {patch} hooks active (rank {rank}): DUMP_PHASE={switches['phase']}, "
            f"config {config_path}, dump path {dump_path}, "
            f"PROMPTS_ONLY {'on' if switches['prompts_only'] else 'off'}",
            file=sys.stderr,
            flush=True,
        )

    def _rlprobe_capture_switches(self, environ=None):
        # The log-prob capture's switches: {"on", "dir", "warnings"}. `MISMATCH_ON` is a switch
        # (the values above); `MISMATCH_DIR` the folder of the per-step files (default
        # `rlprobe-logprobs` in the working directory). ValueError naming the variable otherwise.
        import os

        env = os.environ if environ is None else environ
        on = self._rlprobe_switch("MISMATCH_ON", env)
        raw_dir = env.get("MISMATCH_DIR", "")
        directory = raw_dir.strip() or "rlprobe-logprobs"
        if "\n" in directory or "\0" in directory:
            raise ValueError(
                f"rlprobe-patch: MISMATCH_DIR={raw_dir!r}{self._rlprobe_on_rank(env)} is not a folder name"
            )
        warnings = []
        if on and self._rlprobe_switch("PROMPTS_ONLY", env):
            warnings.append(
                "rlprobe-patch: MISMATCH_ON with PROMPTS_ONLY on: the batches are cut to their prompts and hold "
                "no response token to compare; capture on a run without PROMPTS_ONLY"
            )
        if raw_dir.strip() and not on:
            warnings.append("rlprobe-patch: MISMATCH_DIR is set and MISMATCH_ON is off: nothing is captured")
        return {"on": on, "dir": directory, "warnings": warnings}

    def _rlprobe_rollout_record_dir(self, capture):
        # Where a rollout engine writes its record of each request (vllm.rollout-record), given the
        # capture switches (`_rlprobe_capture_switches`) with the capture on: (MISMATCH_DIR/rollout,
        # None), or (None, why) when MISMATCH_DIR is not an absolute path: the engine runs in other
        # processes and another working directory than the trainer, so a relative folder is not the
        # trainer's capture folder.
        import os

        directory = capture["dir"]
        if os.path.isabs(directory):
            return os.path.join(directory, "rollout"), None
        return None, (
            f"rlprobe-patch: MISMATCH_ON with MISMATCH_DIR {directory}, not an absolute path: the rollout engine "
            "runs in another process and working directory than the trainer and writes no record of its requests "
            "(vllm.rollout-record); export MISMATCH_DIR as an absolute path"
        )

    def _rlprobe_run_capture(self):
        # The capture switches of this process, read at the first step and kept (as the dump
        # switches are): off, each later step costs one dictionary lookup.
        import sys

        run = sys.modules.get("_rlprobe_patch_capture")
        if run is None:
            import types

            capture = self._rlprobe_capture_switches()
            for warning in capture["warnings"]:
                print(warning, file=sys.stderr, flush=True)
            run = types.ModuleType("_rlprobe_patch_capture", "rlprobe-patch: the capture switches of this process")
            run.capture = capture
            sys.modules["_rlprobe_patch_capture"] = run
        return run.capture
