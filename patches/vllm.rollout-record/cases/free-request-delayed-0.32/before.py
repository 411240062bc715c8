# Case: vLLM 0.16 to 0.34: _free_request(self, request, delay_free_blocks=False), a docstring-free
# body that starts with the assert, then the connectors (a tuple returned from 0.26).
from typing import Any

from vllm.v1.request import Request


class Scheduler(SchedulerInterface):
    def _free_request(
        self, request: Request, delay_free_blocks: bool = False
    ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        assert request.is_finished()

        if self.aux_output_connector is not None:
            self.aux_output_connector.request_finished(request)
        self._inflight_prefills.discard(request)
        connector_delay_free_blocks, kv_xfer_params = self._connector_finished(request)
        ec_xfer_params: dict[str, Any] | None = None

        self.encoder_cache_manager.free(request)
        self.finished_req_ids.add(request.request_id)

        delay_free_blocks |= connector_delay_free_blocks
        if not delay_free_blocks:
            self._free_blocks(request)

        return kv_xfer_params, ec_xfer_params


class AsyncScheduler(Scheduler):
    def _update_after_schedule(self, scheduler_output) -> None:
        super()._update_after_schedule(scheduler_output)
