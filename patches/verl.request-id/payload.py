"""What `verl.request-id` inserts into verl's rollout client.

The request id the inference engine saw is kept in `TokenOutput.extra_fields["request_id"]`.
From there verl copies it into the batch's `non_tensor_batch["request_id"]`, so the training
side can log it next to each micro-batch (update_actor_log.jsonl) and a rollout dump can be
matched with a training dump. The id sent to the engine is first named `vllm_request_id`
(the codemod rewrites `request_id=<expr>` of the server call into `request_id=vllm_request_id`).
The skill's checker looks for `extra_fields["request_id"]` and `vllm_request_id`.
"""


def keep_request_id(output, vllm_request_id):
    """Right after `output = await server.generate.remote(request_id=vllm_request_id, ...)`."""
    output.extra_fields["request_id"] = vllm_request_id  # rlprobe-patch


def keep_first_request_id(final_output, output):
    """`FullyAsyncLLMServerClient.generate`, right after `output = await super().generate(...)`.

    A partial rollout resumes with new engine requests; keep the first one's id, the request
    that prefilled the prompt (as the client keeps the first prefill's cache hits).
    """
    if "request_id" in output.extra_fields:  # rlprobe-patch
        final_output.extra_fields.setdefault("request_id", output.extra_fields["request_id"])
