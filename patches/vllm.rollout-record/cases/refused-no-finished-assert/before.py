# Case: a _free_request that no longer asserts the request finished: the anchor is gone.
from vllm.v1.request import Request


class Scheduler(SchedulerInterface):
    def _free_request(self, request: Request, delay_free_blocks: bool = False):
        if not request.is_finished():
            raise ValueError(request.request_id)
        self.encoder_cache_manager.free(request)
        if not delay_free_blocks:
            self._free_blocks(request)
