# Added by rlprobe-patch (vllm.dispatch-logger); `rlprobe-patch revert` removes this file.
"""Per-forward dispatch log for vllm.model-runner's msprobe dumps of vLLM's GPUModelRunner.

msprobe dumps one `step{N}/rank{M}/dump.json` per forward pass. This log says which requests each
dumped pass served, so that a rollout prefill can be matched with a training micro-batch by
request id: `{dump_path}/{pid}/dispatch_log.jsonl`, one JSON line per dumped pass, in the shape of
vLLM-Ascend's dispatch log: the msprobe step and rank, the phase (`prefill` when every request of
the pass is new or still filling its prompt, `decode` when none is, `mixed` otherwise), the
request ids as vLLM runs them (check-dump strips the `-<8 hex>` vLLM >= 0.14 appends), the tokens
scheduled per request, the TP and DP rank, the pid, the dump the line describes (`dump`, relative
to the dump path), and the request msprobe's `request_id` field cut the dump down to
(`dumped_request_id`, when the config sets one and the pass holds it).
"""

import json
import logging
import os
import re
import time

logger = logging.getLogger(__name__)


def log_forward_pass(runner, scheduler_output, req_ids):
    """Called by the patched `execute_model` right after the forward, before msprobe's step closes;
    `req_ids`: the batch's requests in the order of its rows."""
    dispatch_logger = runner.__dict__.get("_msprobe_dispatch_logger", False)
    if dispatch_logger is False:  # first pass: a logger beside the dumps, or None without a dump path
        dispatch_logger = runner._msprobe_dispatch_logger = DispatchLogger.for_debugger(runner.msprobe_debugger)
    return None if dispatch_logger is None else dispatch_logger.log_forward(runner, scheduler_output, req_ids)


class DispatchLogger:
    """Appends one line per dumped forward pass to `{dump_path}/{pid}/dispatch_log.jsonl`."""

    def __init__(self, dump_path, request_id=None):
        self.path = os.path.join(dump_path, str(os.getpid()), "dispatch_log.jsonl")
        self.request_id = request_id
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")  # kept open for the whole run
        self._failed = False

    @classmethod
    def for_debugger(cls, debugger):
        """A logger writing next to the debugger's dumps, or None when it has no dump path."""
        config = getattr(debugger, "config", None)
        dump_path = getattr(config, "dump_path", None)
        return cls(dump_path, getattr(config, "request_id", None)) if dump_path else None

    def log_forward(self, runner, scheduler_output, req_ids):
        """Log the pass when msprobe dumps it; a logging error never stops the rollout (said once)."""
        try:
            service = getattr(runner.msprobe_debugger, "service", None)
            if service is None or not getattr(service, "primitive_switch", False):
                return None  # msprobe does not dump this pass (a step or rank not asked for, or done)
            record = self.record(runner, scheduler_output, service, req_ids)
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
            return record
        except Exception as exc:
            if not self._failed:
                logger.warning(f"rlprobe-patch dispatch log: {type(exc).__name__}: {exc}")
                self._failed = True
            return None

    def record(self, runner, scheduler_output, service, req_ids):
        new_ids = [str(req.req_id) for req in getattr(scheduler_output, "scheduled_new_reqs", None) or []]
        tokens = {str(k): int(v) for k, v in (scheduler_output.num_scheduled_tokens or {}).items()}
        # In the batch's order (the order of the dumped rows).
        order = [str(r) for r in req_ids or [] if r is not None and str(r) in tokens]
        request_ids = order + [r for r in tokens if r not in order]
        computed = self._computed_tokens(runner, request_ids)
        # Still prefilling: new to the engine, or a cached request whose prompt is not all computed.
        prefilling = [
            r for r in request_ids if r in new_ids or (r in computed and computed[r][0] + tokens[r] <= computed[r][1])
        ]
        phase = "prefill" if len(prefilling) == len(request_ids) else ("decode" if not prefilling else "mixed")
        sent = {r: re.sub(r"-[0-9a-f]{8}$", "", r) for r in request_ids}
        dumped = next((r for r in request_ids if self.request_id and sent[r] == self.request_id), None)
        parallel = runner.vllm_config.parallel_config
        step, rank = getattr(service, "current_iter", None), getattr(service, "current_rank", None)
        folder = f"rank{rank}" if rank is not None else f"proc{os.getpid()}"  # msprobe's own naming
        return {
            "source": "dispatch",
            "engine": "vllm",
            "timestamp": time.time(),
            "pid": os.getpid(),
            "rank": rank,
            "dump": f"step{step}/{folder}/dump.json",  # relative to the dump path, this file's parent
            "tp_rank": self._tp_rank(),
            "dp_rank": int(getattr(parallel, "data_parallel_rank", 0) or 0),
            "step": step,
            "phase": phase,
            "request_ids": request_ids,
            "new_request_ids": new_ids,
            "prefill_request_ids": prefilling,
            "num_scheduled_tokens": {r: tokens[r] for r in request_ids},
            "total_num_scheduled_tokens": int(getattr(scheduler_output, "total_num_scheduled_tokens", 0) or 0),
            "num_requests": len(request_ids),
            "dumped_request_id": dumped,
        }

    @staticmethod
    def _computed_tokens(runner, request_ids):
        # {request id: (tokens computed before this pass, prompt length)} where the runner keeps its
        # requests' states (V1's `requests`); elsewhere only new requests count as prefilling.
        found = {}
        requests = getattr(runner, "requests", None)
        if isinstance(requests, dict):
            for r in request_ids:
                state = requests.get(r)
                prompt = getattr(state, "prompt_token_ids", None)
                if state is not None and prompt is not None:
                    found[r] = (int(getattr(state, "num_computed_tokens", 0) or 0), len(prompt))
        return found

    @staticmethod
    def _tp_rank():
        try:
            from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

            return int(get_tensor_model_parallel_rank())
        except Exception:  # no model parallel group (a bare runner): one rank
            return 0
