# Case (refused): verl 0.7.1's forward_backward_batch whose nested forward_step is renamed.
"""Megatron Actor (the shape of verl 0.7.1's megatron_actor.py, shortened)."""

import logging
import os
from functools import partial

import torch
from megatron.core import parallel_state as mpu
from megatron.core.pipeline_parallel import get_forward_backward_func

from verl.utils.device import get_device_id
from verl.utils.megatron_utils import unwrap_model
from verl.workers.actor import BasePPOActor

logger = logging.getLogger(__file__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "WARN"))


class MegatronPPOActor(BasePPOActor):
    def __init__(
        self,
        config,
        model_config,
        hf_config,
        tf_config,
        actor_module,
        actor_optimizer,
    ):
        """MegatronPPOActor class."""
        super().__init__(config)
        self._validate_config(config)
        self.actor_module = actor_module
        self.actor_optimizer = actor_optimizer
        self.mini_layer_topk_idx_list = []

    def compute_log_prob(self, data, calculate_entropy=False) -> torch.Tensor:
        """Compute the log probability of the responses."""
        prev_modes = [m.training for m in self.actor_module]
        micro_batch_size = data.meta_info.get("micro_batch_size", None)

        def compute_logprobs_fn(output, data, use_dynamic_bsz=False, indices=None):
            response_length = data["responses"].size(1)
            return {"log_probs": output["log_probs"][:, -response_length - 1 : -1]}

        with torch.no_grad():
            output = self.forward_backward_batch(
                data, forward_only=True, post_process_fn=compute_logprobs_fn, micro_batch_size=micro_batch_size
            )
        return output, None, None

    def forward_backward_batch(
        self,
        data,
        forward_only=False,
        post_process_fn=None,
        calculate_entropy=False,
        micro_batch_size=None,
    ):
        """
        We assume:
        - The model takes input: (input_ids, attention_mask, position_ids). No rmpad for the input
        """
        micro_batches = data.batch.split(micro_batch_size)
        n_micro_batch = len(micro_batches)
        forward_backward_func = get_forward_backward_func()

        def loss_func(output, data, meta_info):
            device = output["log_probs"].device
            metrics = {}
            if forward_only:
                if post_process_fn is not None:
                    metrics.update(post_process_fn(output, data))
                if not calculate_entropy:
                    return torch.tensor(1.0, device=device), metrics
            if forward_only:
                policy_loss = torch.tensor(1.0, device=device)
            else:
                policy_loss = -output["log_probs"].mean()
            return policy_loss, [metrics, None]

        def forward_step_renamed(batch_iter, model, return_schedule_plan: bool = False):
            """
            Args:
                batch_iter: the batch iterator
                model: the model
            """
            if return_schedule_plan:
                assert self.tf_config.overlap_moe_expert_parallel_comm

            batch = next(batch_iter)
            batch = batch.to(get_device_id())
            batch = batch.contiguous()
            unwrapped_model = unwrap_model(model)

            def logits_processor(logits, label, label_mask):
                ret = {"log_probs": logits.log_softmax(-1)}
                return ret

            output = model(batch["input_ids"], logits_processor=logits_processor)
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
        losses_reduced = {"output": losses_reduced}
        return losses_reduced
