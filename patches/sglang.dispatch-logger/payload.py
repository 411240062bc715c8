"""What `sglang.dispatch-logger` inserts into `sglang/srt/model_executor/model_runner.py`.

The new module `dispatch_logger.py` (beside this file) is added as
`sglang/srt/model_executor/dispatch_logger.py`. In `ModelRunner.forward`, right after the
block that runs the model, the pass is logged while the msprobe step it belongs to is still
open: `{dump_path}/{pid}/dispatch_log.jsonl`, one line per dumped forward pass. Only when the
runner has a debugger (`self.msprobe_debugger`: SGLang's own from 0.5.11, sglang.model-runner's
before): otherwise nothing is imported and no file is touched.

In SGLang 0.5.8 and 0.5.9 `ForwardBatch.init_new` (forward_batch_info.py) also keeps the rids
of the `ModelWorkerBatch.reqs` it is built from, as `rids` (a field from 0.5.10). Before 0.5.8
the `ModelWorkerBatch` carries no request: `Scheduler.run_batch` (scheduler.py) puts the rids of
the `ScheduleBatch` it runs on the `ModelWorkerBatch` it builds (the same object reaches
`ForwardBatch.init_new`, also through the overlap scheduler's queue), and `init_new` keeps them.

A statement hook only, no added method: sglang.model-runner adds methods to `ModelRunner` in
the same file, and two patches appending to one class would depend on their order.
"""


def log_forward(self, forward_batch):
    """Right after the `with ...with_forward_pass(...)` block of `ModelRunner.forward`."""
    if getattr(self, "msprobe_debugger", None) is not None:  # rlprobe-patch
        from sglang.srt.model_executor.dispatch_logger import log_forward_pass

        log_forward_pass(self, forward_batch)


def keep_rids(batch, ret):
    """0.5.8 and 0.5.9: right after `ret = cls(...)` in `ForwardBatch.init_new`."""
    ret.rids = None if batch.reqs is None else [req.rid for req in batch.reqs]  # rlprobe-patch


def keep_scheduler_rids(batch, worker_batch):
    """Before 0.5.8: right after `<worker_batch> = batch.get_model_worker_batch()` in the
    `if self.spec_algorithm.is_none():` block of `Scheduler.run_batch`."""
    worker_batch.rids = [req.rid for req in batch.reqs]  # rlprobe-patch


def rids_from_scheduler(batch, ret):
    """Before 0.5.8: right after `ret = cls(...)` in `ForwardBatch.init_new`."""
    ret.rids = getattr(batch, "rids", None)  # rlprobe-patch
