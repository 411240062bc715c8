"""Megatron Actor (the shape of verl 0.6.0's megatron_actor.py, shortened)."""

import logging
import os
from functools import partial

import torch
from megatron.core import parallel_state as mpu
from megatron.core.pipeline_parallel import get_forward_backward_func

from verl.utils.device import get_device_id
from verl.workers.actor import BasePPOActor

logger = logging.getLogger(__file__)


class MegatronPPOActor(BasePPOActor):
    def __init__(self, config, model_config, hf_config, tf_config, actor_module, actor_optimizer):
        """MegatronPPOActor class."""
        super().__init__(config)
        self.actor_module = actor_module
        self.actor_optimizer = actor_optimizer

    def compute_log_prob(self, data, calculate_entropy=False) -> torch.Tensor:
        """Compute the log probability of the responses."""
        micro_batch_size = data.meta_info.get("micro_batch_size", None)
        with torch.no_grad():
            output = self.forward_backward_batch(data, forward_only=True, micro_batch_size=micro_batch_size)
        return output, None

    def forward_backward_batch(self, data, forward_only=False, post_process_fn=None, micro_batch_size=None):
        """
        We assume:
        - The model takes input: (input_ids, attention_mask, position_ids). No rmpad for the input
        """
        micro_batches = data.batch.split(micro_batch_size)
        n_micro_batch = len(micro_batches)
        forward_backward_func = get_forward_backward_func()

        def loss_func(output, data, meta_info):
            device = output.device
            metrics = {}
            if forward_only:
                return torch.tensor(1.0, device=device), metrics
            policy_loss = output.mean()
            return policy_loss, [metrics, None]

        def forward_step(batch_iter, model):
            batch = next(batch_iter)
            batch = batch.to(get_device_id())
            batch = batch.contiguous()
            output = model(batch["input_ids"])
            return output, partial(loss_func, data=batch, meta_info=None)

        batch_generator = iter(micro_batches)
        if mpu.get_pipeline_model_parallel_world_size() > 1:
            losses_reduced = forward_backward_func(
                forward_step_func=forward_step,
                data_iterator=batch_generator,
                model=self.actor_module,
                num_microbatches=n_micro_batch,
                forward_only=forward_only,
            )
        else:
            losses_reduced = forward_backward_func(
                forward_step_func=forward_step,
                data_iterator=batch_generator,
                model=self.actor_module,
                num_microbatches=n_micro_batch,
                forward_only=forward_only,
            )
        # loss_reduces contains the stats returned from loss_func
        return {"output": losses_reduced}
