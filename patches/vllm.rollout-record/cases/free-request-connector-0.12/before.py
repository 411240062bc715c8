# Case: vLLM 0.9 to 0.15: _free_request asks the KV connector first and returns its transfer params.
from typing import Any

from vllm.v1.request import Request


class Scheduler(SchedulerInterface):
    def _free_request(self, request: Request) -> dict[str, Any] | None:
        assert request.is_finished()

        delay_free_blocks, kv_xfer_params = self._connector_finished(request)
        self.encoder_cache_manager.free(request)
        self.finished_req_ids.add(request.request_id)

        if not delay_free_blocks:
            self._free_blocks(request)

        return kv_xfer_params

    def _free_blocks(self, request: Request):
        self.kv_cache_manager.free(request)
        del self.requests[request.request_id]
