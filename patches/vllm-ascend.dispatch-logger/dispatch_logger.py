# Added by rlprobe-patch (vllm-ascend.dispatch-logger); `rlprobe-patch revert` removes this file.
"""Per-step dispatch log for msprobe dumps of vLLM-Ascend's NPUModelRunner.

msprobe dumps one `step{N}/rank{M}/dump.json` per engine step. This log says which requests
each dumped step carried, so that a rollout step can be matched with a training
micro-batch by request id: `{dump_path}/{pid}/dispatch_log.jsonl`, one JSON line per step
with the phase (prefill when a request is new to the engine or still filling its prompt,
else decode), the request ids and their scheduled token counts.
"""

import json
import os
import time


class DispatchLogger:
    """Appends one line per dumped step to `{dump_path}/{pid}/dispatch_log.jsonl`."""

    def __init__(self, dump_path: str) -> None:
        self.path = os.path.join(dump_path, str(os.getpid()), "dispatch_log.jsonl")
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")  # kept open for the whole run

    @classmethod
    def for_debugger(cls, debugger):
        """A logger writing next to the debugger's dumps, or None when it has no dump path."""
        dump_path = getattr(getattr(debugger, "config", None), "dump_path", None)
        return cls(dump_path) if dump_path else None

    def log_step(self, scheduler_output, step, rank) -> dict:
        new_ids = [str(req.req_id) for req in getattr(scheduler_output, "scheduled_new_reqs", None) or []]
        cached = getattr(scheduler_output, "scheduled_cached_reqs", None)
        if isinstance(cached, list):  # older vLLM: a list of per-request objects
            cached_ids = [str(req.req_id) for req in cached]
        else:  # vLLM v1 CachedRequestData: parallel lists
            cached_ids = [str(req_id) for req_id in getattr(cached, "req_ids", None) or []]
        tokens = {str(k): int(v) for k, v in (getattr(scheduler_output, "num_scheduled_tokens", None) or {}).items()}
        # A cached request scheduled for more than one token is still prefilling (chunked prefill).
        prefilling = new_ids + [req_id for req_id in cached_ids if tokens.get(req_id, 0) > 1]
        record = {
            "source": "dispatch",
            "timestamp": time.time(),
            "pid": os.getpid(),
            "rank": rank,
            "step": step,
            "phase": "prefill" if prefilling else "decode",
            "request_ids": new_ids + cached_ids,
            "new_request_ids": new_ids,
            "prefill_request_ids": prefilling,
            "num_scheduled_tokens": tokens,
            "total_num_scheduled_tokens": int(getattr(scheduler_output, "total_num_scheduled_tokens", 0) or 0),
            "num_requests": len(new_ids) + len(cached_ids),
        }
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        return record
