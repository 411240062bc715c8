# Case: verl 0.7.1's AsyncLLMServerManager.generate.
from uuid import uuid4


class AsyncLLMServerManager:
    async def generate(self, request_id, *, prompt_ids, sampling_params, image_data=None, video_data=None):
        """Generate tokens from prompt ids."""
        server_id, server = await self._acquire_server(request_id)
        try:
            vllm_request_id = uuid4().hex  # rlprobe-patch
            output: TokenOutput = await server.generate.remote(
                request_id=vllm_request_id,  # use new request_id for each turn
                prompt_ids=prompt_ids,
                sampling_params=sampling_params,
            )
            output.extra_fields["request_id"] = vllm_request_id  # rlprobe-patch
            return output
        finally:
            self._release_server(server_id)
