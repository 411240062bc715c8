# Written for rlprobe-patch: the shape of slime 0.2.x's sglang_rollout.generate (not slime's code).
import logging

logger = logging.getLogger(__name__)


async def generate(args, sample, sampling_params):
    """Generate one sample."""
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    if sampling_params["max_new_tokens"] == 0:
        return sample

    # Prepare payload for sglang server
    payload = {
        "sampling_params": sampling_params,
        "return_logprob": True,
    }
    import os  # rlprobe-patch

    if int(os.environ.get("DUMP_ON", "0")) and sample.index is not None and isinstance(sample.metadata, dict):
        _rlprobe_request_ids = sample.metadata.setdefault("rlprobe_request_ids", [])
        payload["rid"] = f"slime-{sample.index}" + (f"-{len(_rlprobe_request_ids)}" if _rlprobe_request_ids else "")
        _rlprobe_request_ids.append(payload["rid"])

    if len(sample.response) > 0:
        payload["input_ids"] = sample.tokens
    else:
        payload["input_ids"] = sample.prompt_ids

    output = await post(url, payload)
    sample.update_from_meta_info(args, output["meta_info"])
    return sample
