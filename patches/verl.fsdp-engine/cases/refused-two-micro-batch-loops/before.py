# Case (refused): verl 0.9.1's forward_backward_batch with its micro-batch loop written twice: ambiguous.
import logging
import os

logger = logging.getLogger(__file__)


class FSDPEngine:
  def __init__(self, engine_config):
    """Docstring stays first."""
    self.engine_config = engine_config
    self.pad_to_length_bucket: int = self.engine_config.pad_to_length_bucket

  def forward_backward_batch(self, data, loss_function, forward_only=False):
    micro_batches, indices = prepare_micro_batches(data=data)
    output_lst = []
    scaler = getattr(self, "scaler", None)

    for micro_batch_idx, micro_batch in enumerate(micro_batches):
      sync_ctx = nullcontext() if forward_only else self._gradient_sync_context(micro_batch_idx)
      # Name each micro-batch in the trace.
      with ctx, sync_ctx, torch.profiler.record_function(f"micro_batch{micro_batch_idx}"):
        loss, meta_info = self.forward_step(micro_batch, loss_function=loss_function, forward_only=forward_only)
        if not forward_only:
          if scaler is not None:
            scaler.scale(loss).backward()
          else:
            loss.backward()

      output_lst.append(meta_info)
    for micro_batch_idx, micro_batch in enumerate(micro_batches):
      sync_ctx = nullcontext() if forward_only else self._gradient_sync_context(micro_batch_idx)
      # Name each micro-batch in the trace.
      with ctx, sync_ctx, torch.profiler.record_function(f"micro_batch{micro_batch_idx}"):
        loss, meta_info = self.forward_step(micro_batch, loss_function=loss_function, forward_only=forward_only)
        if not forward_only:
          if scaler is not None:
            scaler.scale(loss).backward()
          else:
            loss.backward()

      output_lst.append(meta_info)

    return postprocess_batch_func(output_lst=output_lst, indices=indices, data=data)
