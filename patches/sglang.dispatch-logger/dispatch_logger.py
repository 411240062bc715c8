# Added by rlprobe-patch (sglang.dispatch-logger); `rlprobe-patch revert` removes this file.
"""Per-forward dispatch log for msprobe dumps of SGLang's ModelRunner.

msprobe dumps one `step{N}/rank{M}/dump.json` per `ModelRunner.forward` pass. This log says
which requests each dumped pass served, so that a rollout prefill can be matched with a
training micro-batch by request id: `{dump_path}/{pid}/dispatch_log.jsonl`, one JSON line per
dumped pass with the msprobe step and rank (and the dump file they name), the forward mode
(`extend`, `decode`, `mixed`, ...; idle passes are skipped), the phase (`prefill` for an
extend pass), the request ids (`ForwardBatch.rids`, which this patch fills below SGLang
0.5.10), each request's extend and prefix length, and the TP/DP rank and PD role of the server.
"""

import json
import logging
import os
import time

logger = logging.getLogger(__name__)


def _ints(values):
    if values is None:
        return None
    if hasattr(values, "tolist"):
        values = values.tolist()
    return [int(v) for v in values]


def log_forward_pass(runner, forward_batch):
    """Called by the patched `ModelRunner.forward` when the runner has a debugger."""
    dispatch_logger = runner.__dict__.get("_msprobe_dispatch_logger", False)
    if dispatch_logger is False:  # first pass: a logger beside the dumps, or None without a dump path
        dispatch_logger = runner._msprobe_dispatch_logger = DispatchLogger.for_debugger(runner.msprobe_debugger)
    return None if dispatch_logger is None else dispatch_logger.log_forward(runner, forward_batch)


class DispatchLogger:
    """Appends one line per dumped forward pass to `{dump_path}/{pid}/dispatch_log.jsonl`."""

    def __init__(self, dump_path: str) -> None:
        self.dump_path = dump_path
        self.path = os.path.join(dump_path, str(os.getpid()), "dispatch_log.jsonl")
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")  # kept open for the whole run
        self._failed = False

    @classmethod
    def for_debugger(cls, debugger):
        """A logger writing next to the debugger's dumps, or None when it has no dump path."""
        dump_path = getattr(getattr(debugger, "config", None), "dump_path", None)
        return cls(dump_path) if dump_path else None

    def log_forward(self, runner, forward_batch):
        """Log the pass unless msprobe does not dump it; never lets a logging error stop the forward."""
        try:
            record = self.record(runner, forward_batch)
        except Exception as exc:  # the rollout must go on; say it once
            if not self._failed:
                logger.warning(f"rlprobe-patch dispatch log: {type(exc).__name__}: {exc}")
                self._failed = True
            return None
        if record is not None:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
        return record

    def record(self, runner, forward_batch):
        service = getattr(runner.msprobe_debugger, "service", None)
        config = getattr(service, "config", None)
        step = getattr(service, "current_iter", None)
        rank = getattr(service, "current_rank", None)
        if service is not None and getattr(service, "should_stop_service", False):
            return None  # every step asked for is dumped
        if getattr(config, "step", None) and step not in config.step:
            return None  # msprobe does not dump this step
        if getattr(config, "rank", None) and rank not in config.rank:
            return None
        mode = getattr(forward_batch.forward_mode, "name", str(forward_batch.forward_mode)).lower()
        if mode == "idle":
            return None  # data-parallel padding pass: no request
        rids = getattr(forward_batch, "rids", None)
        extend_lens = _ints(getattr(forward_batch, "extend_seq_lens_cpu", None))
        prefix_lens = _ints(getattr(forward_batch, "extend_prefix_lens_cpu", None))
        seq_lens = _ints(getattr(forward_batch, "seq_lens_cpu", None))
        server_args = getattr(runner, "server_args", None)
        role = str(getattr(server_args, "disaggregation_mode", None) or "null")
        folder = f"rank{rank}" if rank is not None else f"proc{os.getpid()}"  # msprobe's own naming
        return {
            "source": "sglang",
            "timestamp": time.time(),
            "pid": os.getpid(),
            "step": step,
            "rank": rank,
            "dump": f"step{step}/{folder}/dump.json",
            "forward_pass_id": getattr(runner, "forward_pass_id", None),
            "mode": mode,
            "phase": {"extend": "prefill", "split_prefill": "prefill"}.get(mode, mode),
            "rids": None if rids is None else [str(r) for r in rids],
            "batch_size": int(getattr(forward_batch, "batch_size", 0) or 0),
            "extend_lens": extend_lens if mode != "decode" else None,
            "prefix_lens": prefix_lens if mode != "decode" else None,
            "seq_lens": seq_lens,
            "tp_rank": getattr(runner, "tp_rank", None),
            "dp_rank": getattr(runner, "dp_rank", None),
            "gpu_id": getattr(runner, "gpu_id", None),
            "pd_role": role,
        }
