# Case (refused): verl 0.7.1's DataParallelPPOActor with compute_log_prob renamed.
"""Single Process Actor (the shape of verl 0.7.1's dp_actor.py, shortened)."""

import logging
import os

import torch

from verl import DataProto
from verl.utils.device import get_device_id
from verl.utils.profiler import GPUMemoryLogger
from verl.workers.actor import BasePPOActor

logger = logging.getLogger(__file__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "WARN"))


class DataParallelPPOActor(BasePPOActor):
    """FSDP DataParallel PPO Actor or Ref worker"""

    def __init__(self, config, actor_module, actor_optimizer=None):
        """When optimizer is None, it is Reference Policy"""
        super().__init__(config)
        self.actor_module = actor_module
        self.actor_optimizer = actor_optimizer
        if self.config.get("calculate_sum_pi_squared", False):
            self.calculate_sum_pi_squared_from_logits = None

    def compute_log_prob_renamed(self, data: DataProto, calculate_entropy: bool = False) -> dict[str, torch.Tensor]:
        """Compute the log probability of the responses.

        Returns:
            dict[str, torch.Tensor]: a dict containing keys
        """
        self.actor_module.eval()
        micro_batch_size = data.meta_info["micro_batch_size"]
        use_dynamic_bsz = data.meta_info["use_dynamic_bsz"]
        has_multi_modal_inputs = "multi_modal_inputs" in data.non_tensor_batch.keys()

        select_keys = ["responses", "input_ids", "attention_mask", "position_ids"]
        non_tensor_select_keys = ["multi_modal_inputs"] if has_multi_modal_inputs else []
        if self.use_prefix_grouper:
            if "uid" in data.non_tensor_batch:
                non_tensor_select_keys.append("uid")

        data = data.select(batch_keys=select_keys, non_tensor_batch_keys=non_tensor_select_keys)

        if use_dynamic_bsz:
            micro_batches, batch_idx_list = prepare_dynamic_batch(data, max_token_len=1024)
        else:
            micro_batches = data.split(micro_batch_size)

        log_probs_lst = []
        for micro_batch in micro_batches:
            micro_batch = micro_batch.to(get_device_id())
            model_inputs = {**micro_batch.batch, **micro_batch.non_tensor_batch, "pad_token_id": 0}
            with torch.no_grad():
                outputs = self._forward_micro_batch(model_inputs, temperature=1.0)
            log_probs_lst.append(outputs["log_probs"])

        outputs = {"log_probs": torch.concat(log_probs_lst, dim=0)}
        return outputs

    @GPUMemoryLogger(role="dp actor", logger=logger)
    def update_policy(self, data: DataProto):
        # make sure we are in training mode
        self.actor_module.train()
        select_keys = ["responses", "response_mask", "input_ids", "attention_mask", "position_ids"]
        non_tensor_select_keys = []
        if self.use_prefix_grouper and "uid" in data.non_tensor_batch.keys():
            non_tensor_select_keys.append("uid")

        data = data.select(batch_keys=select_keys, non_tensor_batch_keys=non_tensor_select_keys)
        mini_batches = data.split(self.config.ppo_mini_batch_size)

        metrics = {"actor/pg_loss": 0.0}
        for _ in range(self.config.ppo_epochs):
            for batch_idx, mini_batch in enumerate(mini_batches):
                micro_batches = mini_batch.split(self.config.ppo_micro_batch_size_per_gpu)
                self.actor_optimizer.zero_grad()

                for micro_batch in micro_batches:
                    micro_batch = micro_batch.to(get_device_id())
                    model_inputs = {**micro_batch.batch, **micro_batch.non_tensor_batch, "pad_token_id": 0}
                    outputs = self._forward_micro_batch(model_inputs, temperature=1.0)
                    loss = -outputs["log_probs"].mean()
                    if self.scaler is not None:
                        self.scaler.scale(loss).backward()
                    else:
                        loss.backward()

                    metrics["actor/pg_loss"] += loss.detach().item()

                grad_norm = self._optimizer_step()
        self.actor_optimizer.zero_grad()
        return metrics
