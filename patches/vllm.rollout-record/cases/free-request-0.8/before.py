# Case: vLLM 0.8.5: _free_request(self, request) frees the KV cache itself and returns nothing.
from vllm.v1.request import Request, RequestStatus


class Scheduler(SchedulerInterface):
    def __init__(self, vllm_config, kv_cache_config, structured_output_manager, log_stats=False):
        self.vllm_config = vllm_config
        self.requests = {}
        self.finished_req_ids = set()

    def finish_requests(self, request_ids, finished_status):
        for req_id in request_ids:
            request = self.requests.get(req_id)
            if request is None:
                continue
            request.status = finished_status
            self._free_request(request)

    def _free_request(self, request: Request) -> None:
        assert request.is_finished()
        self.kv_cache_manager.free(request)
        self.encoder_cache_manager.free(request)
        del self.requests[request.request_id]
        self.finished_req_ids.add(request.request_id)
