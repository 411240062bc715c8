# Case: vLLM 0.16 to 0.34: _free_request(self, request, delay_free_blocks=False), a docstring-free
# body that starts with the assert, then the connectors (a tuple returned from 0.26).
from typing import Any

from vllm.v1.request import Request


class Scheduler(SchedulerInterface):
    def _free_request(
        self, request: Request, delay_free_blocks: bool = False
    ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        assert request.is_finished()
        _RlprobeRolloutRecord()._rlprobe_record_request(self, request)  # rlprobe-patch: MISMATCH_ON

        if self.aux_output_connector is not None:
            self.aux_output_connector.request_finished(request)
        self._inflight_prefills.discard(request)
        connector_delay_free_blocks, kv_xfer_params = self._connector_finished(request)
        ec_xfer_params: dict[str, Any] | None = None

        self.encoder_cache_manager.free(request)
        self.finished_req_ids.add(request.request_id)

        delay_free_blocks |= connector_delay_free_blocks
        if not delay_free_blocks:
            self._free_blocks(request)

        return kv_xfer_params, ec_xfer_params


class AsyncScheduler(Scheduler):
    def _update_after_schedule(self, scheduler_output) -> None:
        super()._update_after_schedule(scheduler_output)


class _RlprobeRolloutRecord:
    # Added by rlprobe-patch (vllm.rollout-record); `rlprobe-patch revert` removes it.
    # A class of its own, appended to the scheduler's module: Scheduler keeps only the hook line.
    # Called with the scheduler and the request it frees.
    def _rlprobe_record_request(self, scheduler, request):
        # One line per finished request, with MISMATCH_ON on and an absolute MISMATCH_DIR.
        capture = self._rlprobe_run_capture()
        if not capture["on"]:
            return
        import sys

        state = capture.setdefault("rollout_record", {})
        if "dir" not in state:  # the first request of this process: where, or why nowhere
            state["dir"], why = self._rlprobe_rollout_record_dir(capture)
            if why is not None:
                print(why, file=sys.stderr, flush=True)
        if state["dir"] is None:
            return
        try:
            line = self._rlprobe_rollout_line(scheduler, request)
            if line is None:
                return
            import os
            import socket

            os.makedirs(state["dir"], exist_ok=True)
            path = os.path.join(state["dir"], f"{socket.gethostname()}-{os.getpid()}.rlprobe-rollout.jsonl")
            with open(path, "a", encoding="utf-8") as records:
                records.write(line)
            if state.get("announced") != path:
                state["announced"] = path
                print(
                    f"rlprobe-patch: vllm.rollout-record r1: each finished request recorded in {path}",
                    file=sys.stderr,
                    flush=True,
                )
        except Exception as exc:
            # The record is evidence, never a reason to stop the engine: said once, later requests tried again.
            if not state.get("failed"):
                state["failed"] = True
                print(
                    f"rlprobe-patch: vllm.rollout-record r1: no record of request {request.request_id} "
                    f"({type(exc).__name__}: {exc}); the engine goes on (said once per process)",
                    file=sys.stderr,
                    flush=True,
                )

    def _rlprobe_rollout_line(self, scheduler, request):
        # The request as the engine saw it, JSON text with its newline (format rlprobe-rollout v1); None
        # for a request that has no token prompt or no sampling.
        params = request.sampling_params
        if params is None or request.prompt_token_ids is None:
            return None
        import json
        import os
        import time

        from vllm.version import __version__

        sampling = {}
        for key in (
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "seed",
            "max_tokens",
            "min_tokens",
            "logprobs",
            "presence_penalty",
            "frequency_penalty",
            "repetition_penalty",
        ):
            value = getattr(params, key, None)
            if value is None or isinstance(value, (bool, int, float, str)):
                sampling[key] = value
        model_config = scheduler.vllm_config.model_config
        mode = getattr(model_config, "logprobs_mode", None)
        reason = request.get_finished_reason()
        record = {
            "format": "rlprobe-rollout",
            "format_version": 1,
            "engine": "vllm",
            "engine_version": str(__version__),
            "request_id": str(request.request_id),
            "prompt_ids": [int(token) for token in request.prompt_token_ids],
            "output_ids": [int(token) for token in request.output_token_ids],
            "finish_reason": None if reason is None else str(reason),
            "sampling": sampling,
            "logprobs_mode": None if mode is None else str(getattr(mode, "value", mode)),
            "dtype": str(model_config.dtype).removeprefix("torch."),
            "model": str(model_config.model),
            "pid": os.getpid(),
            "time": time.time(),
        }
        return json.dumps(record) + "\n"

    # The switch reader (patches/_shared/switches.py): MISMATCH_ON / MISMATCH_DIR read once per process.
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
