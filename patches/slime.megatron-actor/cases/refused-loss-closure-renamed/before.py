# Written for rlprobe-patch: the shape of slime 0.2.x's model.py (not slime's code).
import logging
import os
from functools import partial

import torch
from megatron.core import mpu
from megatron.core.pipeline_parallel import get_forward_backward_func

from .data import get_batch
from .loss import loss_function

logger = logging.getLogger(__name__)


@torch.no_grad()
def forward_only(f, args, model, data_iterator, num_microbatches, store_prefix=""):
    """Forward passes only."""

    for iterator in data_iterator:
        iterator.reset()

    def forward_step(data_iterator, model, return_schedule_plan=False):
        """One micro-batch."""
        batch = get_batch(data_iterator, ["tokens"], args.data_pad_size_multiplier, args.qkv_format)
        output_tensor = model(input_ids=batch["tokens"])
        return output_tensor, partial(f, args=args)

    forward_backward_func = get_forward_backward_func()
    forward_data_store = []
    for step_id in range(len(num_microbatches)):
        # collect_non_loss_data
        forward_data_store += forward_backward_func(
            forward_step_func=forward_step,
            data_iterator=data_iterator,
            model=model,
            num_microbatches=num_microbatches[step_id],
            forward_only=True,
            collect_non_loss_data=True,
        )
    return {f"{store_prefix}{key}": value for key, value in forward_data_store[0].items()}


def train_one_step(args, rollout_id, step_id, data_iterator, model, optimizer, opt_param_scheduler, num_microbatches):
    """One optimizer step."""
    optimizer.zero_grad()

    def forward_step(data_iterator, model, return_schedule_plan=False):
        """One micro-batch."""
        batch = get_batch(data_iterator, ["tokens", "loss_masks"], args.data_pad_size_multiplier, args.qkv_format)
        if os.environ.get("ENABLE_ROUTING_REPLAY", "0") == "1":
            os.environ["ROUTING_REPLAY_STAGE"] = "replay_forward"
        output_tensor = model(input_ids=batch["tokens"])
        return output_tensor, partial(policy_loss, args, batch)

    forward_backward_func = get_forward_backward_func()
    losses_reduced = forward_backward_func(
        forward_step_func=forward_step,
        data_iterator=data_iterator,
        model=model,
        num_microbatches=num_microbatches,
        forward_only=False,
    )
    optimizer.step()
    if mpu.is_pipeline_last_stage(ignore_virtual=True):
        return losses_reduced
    return {}
