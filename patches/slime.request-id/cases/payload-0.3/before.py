# Written for rlprobe-patch: the shape of slime 0.3.x's sglang_rollout.generate (not slime's code).
import json
import logging

logger = logging.getLogger(__name__)


async def generate(args: "Namespace", sample: "Sample", sampling_params: dict) -> "Sample":
    """Generate one sample."""
    payload = {"sampling_params": sampling_params, "return_logprob": True}
    if args.use_rollout_routing_replay:
        payload["return_routed_experts"] = True
    headers = None
    with trace_span(sample, "sglang_generate"):
        output = await post(args.url, payload, headers=headers)
    logger.debug(json.dumps(output["meta_info"]))
    return sample
