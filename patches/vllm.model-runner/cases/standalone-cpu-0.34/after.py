# Case: vLLM's standalone CPU runner (vllm/v1/worker/cpu/standalone_model_runner.py, new in 0.34):
# V2's shape without Triton and no subclass of GPUModelRunner; the forward inside
# `with set_forward_context(...)`, the pass's batch a local, the parameter `dummy_run`.
import torch


class StandaloneCPUModelRunner(LoRAModelRunnerMixin):
    def __init__(self, vllm_config: VllmConfig, device: torch.device):
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.device = device
        set_offloader(create_offloader(self.vllm_config.offload_config))
        self._init_msprobe_debugger()  # rlprobe-patch

    def execute_model(self, scheduler_output, intermediate_tensors=None, dummy_run=False):
        if dummy_run:
            input_batch = InputBatch.make_dummy(num_reqs, num_tokens, self.input_buffers)
        else:
            input_batch = self.prepare_inputs(scheduler_output, batch_req_state)
        with set_forward_context(attn_metadata, self.vllm_config, num_tokens=input_batch.num_tokens_after_padding):
            self.kv_connector.pre_forward(scheduler_output, input_batch)
            if self.msprobe_debugger is not None and not dummy_run:  # rlprobe-patch
                self._msprobe_start(scheduler_output, input_batch.req_ids)
            model_output = self.model(**model_inputs)
        if self._msprobe_open:  # rlprobe-patch
            self._msprobe_open = False
            self.msprobe_debugger.stop()
            self.msprobe_debugger.step()
        self.kv_connector.finish_forward()

        self.execute_model_state = ExecuteModelState(input_batch, model_output)
        return None

    # Added by rlprobe-patch (vllm.model-runner); `rlprobe-patch revert` removes it.
    def _init_msprobe_debugger(self):
        # This worker's msprobe debugger, or None (nothing imported) without a dump config.
        self.msprobe_debugger = None
        self._msprobe_open = False  # a pass's msprobe step is open (started, not yet stopped)
        additional = getattr(self.vllm_config, "additional_config", None)
        path = additional.get("dump_config_path") if isinstance(additional, dict) else None
        if not path or type(self).__module__.startswith("vllm_ascend"):
            return  # vLLM-Ascend's NPUModelRunner builds its own debugger from the same key
        self._rlprobe_run_switches()
        setting = "additional_config.dump_config_path"
        config_path = self._rlprobe_config_path(setting, "", {setting: str(path)})
        if not self.model_config.enforce_eager:
            raise ValueError(
                f"rlprobe-patch: msprobe config {setting}={config_path}: vLLM compiles this model and "
                "captures its forward in graphs (enforce_eager=False), where msprobe's module hooks never "
                "run and the dump would be empty: set enforce_eager=True (verl: "
                "actor_rollout_ref.rollout.enforce_eager=True)"
            )
        self.msprobe_debugger = self._rlprobe_debugger(setting, config_path)
        import inspect

        start = type(self.msprobe_debugger).start
        self._msprobe_takes_tokens = "scheduled_tokens" in inspect.signature(start).parameters
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        dump_path = self.msprobe_debugger.config.dump_path
        self._rlprobe_announce("vllm.model-runner r2", rank, config_path, dump_path)

    def _msprobe_start(self, scheduler_output, req_ids):
        # Start the pass's msprobe step; msprobe gets {id as sent: tokens in this pass}, in the
        # batch's order (its `request_id` field slices those rows out of a mixed batch). Not for
        # vLLM's kernel warm-up (V2, before serving: every request named `_warmup_<i>_`).
        if req_ids and all(str(req_id).startswith("_warmup_") for req_id in req_ids):
            return
        self._msprobe_open = True
        if not self._msprobe_takes_tokens:
            self.msprobe_debugger.start(model=self.model)
            return
        import re

        scheduled = scheduler_output.num_scheduled_tokens
        tokens = {}
        for req_id in req_ids:
            if req_id in scheduled:
                # vLLM >= 0.14 runs a request as `<id sent>-<8 hex>`.
                tokens[re.sub(r"-[0-9a-f]{8}$", "", str(req_id))] = int(scheduled[req_id])
        self.msprobe_debugger.start(model=self.model, scheduled_tokens=tokens)

    # The switch reader (patches/_shared/switches.py), with the inference side's reading of
    # DUMP_PHASE (patches/_shared/inference_switches.py).
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
