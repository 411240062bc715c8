# Case: SGLang 0.4.6.post5's ModelRunner (no dp_size yet, tuple return type).
import logging
import os

logger = logging.getLogger(__name__)


class ModelRunner:
    """ModelRunner runs the forward passes of the models."""

    def __init__(self, model_config, mem_fraction_static, gpu_id, tp_rank, tp_size, nccl_port, server_args):
        self._init_msprobe_debugger(server_args)  # rlprobe-patch
        # Parse args
        self.model_config = model_config
        self.mem_fraction_static = mem_fraction_static
        self.gpu_id = gpu_id
        self.forward_pass_id = 0

    def forward(self, forward_batch, skip_attn_backend_init=False, pp_proxy_tensors=None):
        self.forward_pass_id += 1
        if self.msprobe_debugger is not None:  # rlprobe-patch
            self.msprobe_debugger.start(model=self.model, rank_id=self._msprobe_rank_id())
        with get_global_expert_distribution_recorder().with_forward_pass(self.forward_pass_id, forward_batch):
            output = self._forward_raw(forward_batch, skip_attn_backend_init, pp_proxy_tensors)
        if self.eplb_manager is not None:
            self.eplb_manager.on_forward_pass_end(self.forward_pass_id)
        if self.msprobe_debugger is not None:  # rlprobe-patch
            self.msprobe_debugger.stop()
            self.msprobe_debugger.step()
        return output

    # Added by rlprobe-patch (sglang.model-runner); `rlprobe-patch revert` removes it.
    def _init_msprobe_debugger(self, server_args):
        # The switches are checked once per process (a wrong value stops SGLang here).
        self.msprobe_debugger = None
        self._rlprobe_run_switches()
        mode = str(getattr(server_args, "disaggregation_mode", "null"))
        if mode == "prefill":
            config_path = self._msprobe_config_path("MSPROBE_SGLANG_PREFILL_CONFIG", "./config_prefill.json")
        elif mode == "decode":
            config_path = self._msprobe_config_path("MSPROBE_SGLANG_DECODE_CONFIG", "./config_decode.json")
        else:
            config_path = self._msprobe_config_path("MSPROBE_SGLANG_CONFIG", "./config.json")
        if config_path is None:
            return
        self.msprobe_debugger = self._rlprobe_debugger(self._msprobe_config_variable, config_path)
        dump_path = self.msprobe_debugger.config.dump_path
        self._rlprobe_announce("sglang.model-runner r2", None, config_path, dump_path)
        logger.info(f"msprobe dump enabled with {config_path}")

    def _msprobe_config_path(self, variable, default):
        # A variable that is set must name a readable JSON config (else an error naming it);
        # unset, the default is used when that file exists, else no debugger, as before.
        self._msprobe_config_variable = variable
        if not os.environ.get(variable, "").strip() and not os.path.isfile(default):
            return None
        return self._rlprobe_config_path(variable, default)

    def _msprobe_rank_id(self):
        # Data parallel > 1: name the dump after the GPU (dp_size exists from SGLang 0.4.8).
        dp_size = getattr(self, "dp_size", None) or 1
        return self.gpu_id if dp_size > 1 else None

    # The switch reader (patches/_shared/switches.py), with the inference side's reading of
    # DUMP_PHASE (patches/_shared/inference_switches.py: verl's or slime's grammar).
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
        # The switches an inference hook reads: {"dump_on", "prompts_only", "phase", "warnings"};
        # DUMP_PHASE is the training side's (verl's or slime's grammar): only checked for typos.
        import os

        env = os.environ if environ is None else environ
        dump_on = self._rlprobe_switch("DUMP_ON", env)
        prompts_only = self._rlprobe_switch("PROMPTS_ONLY", env)
        raw_phase = env.get("DUMP_PHASE", "")
        passes = (
            "log_prob",
            "update_actor",
            "all",
            "ref_forward",
            "teacher_forward",
            "critic_forward",
            "update_critic",
        )
        phases = tuple(item.strip().lower() for item in raw_phase.split(",") if item.strip()) or ("log_prob",)
        unknown = [item for item in phases if item not in passes]
        if unknown:
            raise ValueError(
                f"rlprobe-patch: DUMP_PHASE={raw_phase!r}{self._rlprobe_on_rank(env)}: "
                f"{', '.join(unknown)} is not a pass of verl's or slime's hooks: use "
                f"{', '.join(passes[:3])} (verl) or a comma-separated list of {', '.join(passes)} (slime)"
            )
        return {"dump_on": dump_on, "prompts_only": prompts_only, "phase": ",".join(phases), "warnings": []}

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
