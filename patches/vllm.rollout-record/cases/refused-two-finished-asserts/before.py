# Case: the assert written twice in _free_request: which one the record follows is a guess.
from vllm.v1.request import Request


class Scheduler(SchedulerInterface):
    def _free_request(self, request: Request) -> None:
        assert request.is_finished()
        self.encoder_cache_manager.free(request)
        assert request.is_finished()
        self._free_blocks(request)
