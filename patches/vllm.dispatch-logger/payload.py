"""What `vllm.dispatch-logger` inserts into vLLM's model runners.

The new module `dispatch_logger.py` (beside this file) is added as
`vllm/v1/worker/dispatch_logger.py`. In `execute_model` (V1 until 0.34, V2 where the release has
it, the standalone CPU runner from 0.34), right after the statement that runs the model's forward,
the pass is logged while the msprobe step it belongs to is still open (vllm.model-runner stops it
after the enclosing `with` block):
`{dump_path}/{pid}/dispatch_log.jsonl`, one line per dumped forward pass. Only while
vllm.model-runner's msprobe step is open (`self._msprobe_open`): without a debugger, and for the
passes it does not dump (vLLM's own: memory profile, kernel warm-up), nothing is logged or imported.

A statement hook only, no added method: vllm.model-runner adds methods to `GPUModelRunner` in the
same files, and two patches appending to one class would depend on their order.
"""


def log_forward(self, scheduler_output):
    """V1: right after the model's forward call in `execute_model`."""
    if getattr(self, "_msprobe_open", False):  # rlprobe-patch
        from vllm.v1.worker.dispatch_logger import log_forward_pass

        log_forward_pass(self, scheduler_output, self.input_batch.req_ids)


def log_forward_v2(self, scheduler_output, input_batch):
    """V2 and the standalone CPU runner: right after the eager forward call in `execute_model` (the
    batch is a local there)."""
    if getattr(self, "_msprobe_open", False):  # rlprobe-patch
        from vllm.v1.worker.dispatch_logger import log_forward_pass

        log_forward_pass(self, scheduler_output, input_batch.req_ids)
