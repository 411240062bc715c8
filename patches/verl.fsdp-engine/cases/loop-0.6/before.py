# Case: the verl 0.6.x shape of FSDPEngine (plain loop, one-item `with`, bare backward).
import logging
import os

logger = logging.getLogger(__file__)


class FSDPEngine:
    def __init__(self, engine_config):
        self.engine_config = engine_config
        self.rank = 0

    def forward_backward_batch(self, data, loss_function, forward_only=False):
        micro_batches, indices = prepare_micro_batches(data=data)
        output_lst = []
        ctx = torch.no_grad() if forward_only else nullcontext()
        for micro_batch in micro_batches:
            with ctx:
                loss, meta_info = self.forward_step(micro_batch, loss_function=loss_function, forward_only=forward_only)
                if not forward_only:
                    loss.backward()
            output_lst.append(meta_info)
        return postprocess_batch_func(output_lst=output_lst, indices=indices, data=data)
