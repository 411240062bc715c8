"""What `vllm.rollout-record` inserts into vLLM's V1 scheduler.

With `MISMATCH_ON` on (the shared switch reader, the switch of `verl.logprob-capture`'s capture)
and `MISMATCH_DIR` an absolute path, `Scheduler._free_request` records each request it frees, right
after its `assert request.is_finished()`: one JSON line, format rlprobe-rollout v1 (read by
`rlprobe_patch.report.rollout_record.read_records`, the one definition of the format), appended to
`MISMATCH_DIR/rollout/<hostname>-<pid>.rlprobe-rollout.jsonl` (a file per engine process, so data
parallel engines never share one): the request id as the engine ran it, the prompt token ids it
received, the token ids it sampled, the finish reason, the sampling settings it applied (its
`SamplingParams`, after the frontend merged the model's generation config), `logprobs_mode`
(null on releases before 0.10, which have none), the dtype the model computes in, the model served,
the pid and the time. A request with no token prompt (prompt embeddings) or no sampling (pooling)
is not recorded.

`MISMATCH_DIR` must be absolute: the engine runs in other processes and another working directory
than the trainer, whose capture is where `report` looks. Relative or unset, nothing is written and
the process says why once on stderr. A failure to write is said once per process and never stops
the engine; a wrong `MISMATCH_ON` value stops it, naming the variable, as every hook's switches do.
Off, each finished request costs one lookup of the kept switches (`_rlprobe_run_capture`); nothing
is imported and no file is touched.
"""

from _shared.switches import Switches


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
    _rlprobe_on_rank = Switches._rlprobe_on_rank
    _rlprobe_switch = Switches._rlprobe_switch
    _rlprobe_capture_switches = Switches._rlprobe_capture_switches
    _rlprobe_rollout_record_dir = Switches._rlprobe_rollout_record_dir
    _rlprobe_run_capture = Switches._rlprobe_run_capture


def record_finished_request(self, request):
    """In `Scheduler._free_request`, right after `assert request.is_finished()`."""
    _RlprobeRolloutRecord()._rlprobe_record_request(self, request)  # rlprobe-patch: MISMATCH_ON
