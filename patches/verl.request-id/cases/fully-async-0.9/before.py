# Case: the fully-async client resumes partial rollouts and merges them into its own output.
class FullyAsyncLLMServerClient(LLMServerClient):
    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        final_output = TokenOutput(token_ids=[], log_probs=[], num_preempted=0)
        while True:
            # 1. generate tokens
            output = await super().generate(
                request_id=request_id,
                prompt_ids=prompt_ids + final_output.token_ids,
                sampling_params=sampling_params,
                **kwargs,
            )

            # 2. merge output into final_output
            final_output.token_ids.extend(output.token_ids)
            if output.stop_reason not in ("aborted", "abort"):
                break
        final_output.extra_fields["global_steps"] = output.extra_fields.get("global_steps")
        return final_output
