"""Single Process Actor (the shape of verl 0.6.0's dp_actor.py, shortened)."""

import logging
import os

import torch

from verl import DataProto
from verl.utils.device import get_device_id
from verl.workers.actor import BasePPOActor

logger = logging.getLogger(__file__)


class DataParallelPPOActor(BasePPOActor):
    def __init__(self, config, actor_module, actor_optimizer=None):
        """When optimizer is None, it is Reference Policy"""
        super().__init__(config)
        self.actor_module = actor_module
        self.actor_optimizer = actor_optimizer

    def compute_log_prob(self, data: DataProto, calculate_entropy=False) -> torch.Tensor:
        """Compute the log probability of the responses."""
        self.actor_module.eval()
        micro_batch_size = data.meta_info["micro_batch_size"]
        has_multi_modal_inputs = "multi_modal_inputs" in data.non_tensor_batch.keys()
        select_keys = ["responses", "input_ids", "attention_mask", "position_ids"]
        non_tensor_select_keys = ["multi_modal_inputs"] if has_multi_modal_inputs else []

        data = data.select(batch_keys=select_keys, non_tensor_batch_keys=non_tensor_select_keys)
        micro_batches = data.split(micro_batch_size)

        log_probs_lst = []
        for micro_batch in micro_batches:
            micro_batch = micro_batch.to(get_device_id())
            model_inputs = {**micro_batch.batch, **micro_batch.non_tensor_batch}
            with torch.no_grad():
                entropy, log_probs = self._forward_micro_batch(model_inputs, temperature=1.0)
            log_probs_lst.append(log_probs)

        log_probs = torch.concat(log_probs_lst, dim=0)
        return log_probs, None

    def update_policy(self, data: DataProto):
        # make sure we are in training mode
        self.actor_module.train()
        select_keys = ["responses", "response_mask", "input_ids", "attention_mask", "position_ids"]
        non_tensor_select_keys = []
        data = data.select(batch_keys=select_keys, non_tensor_batch_keys=non_tensor_select_keys)
        mini_batches = data.split(self.config.ppo_mini_batch_size)

        metrics = {}
        for _ in range(self.config.ppo_epochs):
            for batch_idx, mini_batch in enumerate(mini_batches):
                micro_batches = mini_batch.split(self.config.ppo_micro_batch_size_per_gpu)
                self.actor_optimizer.zero_grad()

                for micro_batch in micro_batches:
                    micro_batch = micro_batch.to(get_device_id())
                    model_inputs = {**micro_batch.batch, **micro_batch.non_tensor_batch}
                    entropy, log_prob = self._forward_micro_batch(model_inputs, temperature=1.0)
                    loss = -log_prob.mean()
                    loss.backward()

                grad_norm = self._optimizer_step()
        self.actor_optimizer.zero_grad()
        return metrics
