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
