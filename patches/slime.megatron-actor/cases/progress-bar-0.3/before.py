# Written for rlprobe-patch: the shape of slime 0.3.x's model.py (not slime's code).
import logging
import os
from functools import partial

import torch
from megatron.core import mpu
from megatron.core.pipeline_parallel import get_forward_backward_func

from .data import get_batch
from .loss import loss_function

logger = logging.getLogger(__name__)


def _wrap(forward_step_func, pbar):
    return forward_step_func


@torch.no_grad()
def forward_only(f, args, model, data_iterator, num_microbatches, store_prefix="", use_rollout_top_p_replay=False):
    """Forward passes only."""
    batch_keys = ["tokens", "loss_masks"]

    def forward_step(data_iterator, model, return_schedule_plan=False):
        """One micro-batch."""
        assert not return_schedule_plan
        batch = get_batch(data_iterator, batch_keys, args.data_pad_size_multiplier, args.allgather_cp)
        output_tensor = model(input_ids=batch["tokens"])
        output_kwargs = {"args": args}
        return output_tensor, partial(f, **output_kwargs)

    forward_backward_func = get_forward_backward_func()
    forward_data_store = []
    pbar = None
    for step_id in range(len(num_microbatches)):
        forward_data_store += forward_backward_func(
            forward_step_func=_wrap(forward_step, pbar),
            data_iterator=data_iterator,
            model=model,
            num_microbatches=num_microbatches[step_id],
            forward_only=True,
        )
    return forward_data_store


def train_one_step(
    args,
    rollout_id,
    step_id,
    data_iterator,
    model,
    optimizer,
    opt_param_scheduler,
    num_microbatches,
    step_global_batch_size,
    microbatch_pbar=None,
):
    """One optimizer step.

    Args:
        step_global_batch_size: the rollouts of this step.
    """
    args = get_args()

    def forward_step(data_iterator, model, return_schedule_plan=False):
        """One micro-batch."""
        batch = get_batch(data_iterator, ["tokens"], args.data_pad_size_multiplier, args.allgather_cp)
        if return_schedule_plan:
            output_tensor = model.build_schedule_plan(input_ids=batch["tokens"])
        else:
            output_tensor = model(input_ids=batch["tokens"])
        return output_tensor, partial(loss_function, args, batch, num_microbatches, step_global_batch_size)

    forward_backward_func = get_forward_backward_func()
    losses_reduced = forward_backward_func(
        forward_step_func=_wrap(forward_step, microbatch_pbar),
        data_iterator=data_iterator,
        model=model,
        num_microbatches=num_microbatches,
        forward_only=False,
    )
    return losses_reduced
