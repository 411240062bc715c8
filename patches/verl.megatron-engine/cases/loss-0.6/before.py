# Case: verl 0.6.0's Megatron engine (loss scaled in place, `return loss, output`).
import logging
import os

import torch

logger = logging.getLogger(__file__)


class MegatronEngine:
    def __init__(self, engine_config):
        self.engine_config = engine_config
        self.weight_converter = None

    def forward_backward_batch(self, data, loss_function, forward_only=False):
        forward_backward_func = get_forward_backward_func()
        losses_reduced = forward_backward_func(forward_step_func=self.forward_step, forward_only=forward_only)
        return losses_reduced


class MegatronEngineWithLMHead(MegatronEngine):
    def forward_step(self, batch_iter, model, postprocess_micro_batch_func):
        batch: TensorDict = next(batch_iter)
        batch = batch.to(get_device_id())
        output = model(batch)
        return output, partial(postprocess_micro_batch_func, data=batch)

    def postprocess_micro_batch_func(self, output, data, forward_only, loss_function):
        if loss_function is not None:
            loss, metrics = loss_function(model_output=output, data=data)
            loss = loss * data["num_micro_batch"] / mpu.get_context_parallel_world_size()
        else:
            loss = torch.tensor(1.0)
        return loss, {"loss": loss}
