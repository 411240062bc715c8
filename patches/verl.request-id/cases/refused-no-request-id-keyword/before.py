# Case (refused): verl 0.9.x's LLMServerClient.generate with `request_id=` taken out of the server call.
class LLMServerClient:
    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        server_id, server = await self._acquire_server(request_id)
        try:
            out = await server.generate.remote(
                prompt_ids=prompt_ids,
                sampling_params=sampling_params,
                **kwargs,
            )
            global_steps = out.extra_fields.get("global_steps")
            return out
        finally:
            self._release_server(server_id, request_id=request_id)
