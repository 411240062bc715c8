# Case (refused): verl 0.9.x's forward_step without `batch = next(batch_iter)`: no place to start a step.
import logging
import os

import torch

logger = logging.getLogger(__file__)


class MegatronEngine:
    def __init__(self, engine_config):
        self.engine_config = engine_config
        if is_cuda_available:
            apply_patch_megatron_recomputation_backward()

    def forward_backward_batch(self, data, loss_function, forward_only=False):
        """Run the schedule."""
        self._distillation_use_topk_active = False
        forward_backward_func = get_forward_backward_func()
        losses_reduced = forward_backward_func(forward_step_func=self.forward_step, forward_only=forward_only)
        return losses_reduced


class MegatronEngineWithLMHead(MegatronEngine):
    def forward_step(self, batch_iter, model, logits_processor_func, postprocess_micro_batch_func):
        output = model(batch)
        return output, partial(postprocess_micro_batch_func, data=batch)

    def postprocess_micro_batch_func(self, output, data, forward_only, loss_function, local_cp_size=None):
        loss, metrics = loss_function(model_output=output, data=data)
        scaled_loss = loss * data["num_micro_batch"]
        if self.tf_config.calculate_per_token_loss:
            local_sum = loss * data["num_tokens"]
            return local_sum, data["num_tokens"], {"loss": loss}
        return scaled_loss, {"loss": loss}
