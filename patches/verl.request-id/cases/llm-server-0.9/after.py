# Case: verl 0.9.x's LLMServerClient.generate, the id from self._vllm_request_id(...).
class LLMServerClient:
    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        server_id, server = await self._acquire_server(request_id)
        try:
            vllm_request_id = self._vllm_request_id(request_id)  # rlprobe-patch
            out = await server.generate.remote(
                request_id=vllm_request_id,  # use new request_id for each turn
                prompt_ids=prompt_ids,
                sampling_params=sampling_params,
                **kwargs,
            )
            out.extra_fields["request_id"] = vllm_request_id  # rlprobe-patch
            global_steps = out.extra_fields.get("global_steps")
            return out
        finally:
            self._release_server(server_id, request_id=request_id)
