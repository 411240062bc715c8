"""What check-dump needs from a rollout to pair its prefills with actor micro-batches by request id.

One table per rollout backend, read by `script` (which sets the values), `detect` (which says which
ones an SGLang script already has), `config` (which writes the generate side's msprobe config for
it) and `check-script`. The vLLM one is what the demo's own vLLM consistency run sets
(`demo/drivers/vllm_rollout.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlprobe_patch.launch.hydra_compose import ROLLOUT


@dataclass(frozen=True)
class PairingSetting:
    key: str
    value: Any
    why: str
    create: bool  # `++key=value`: verl's config has no such key by default


SGLANG_PAIRING = (
    PairingSetting(
        f"{ROLLOUT}.max_num_seqs",
        1,
        "SGLang max_running_requests=1: one request per prefill pass (a batched prefill cannot be paired)",
        False,
    ),
    PairingSetting(
        f"{ROLLOUT}.engine_kwargs.sglang.disable_radix_cache",
        True,
        "no radix cache: a shared prompt prefix is not skipped, each prefill dumps the whole prompt",
        True,
    ),
    PairingSetting(
        f"{ROLLOUT}.engine_kwargs.sglang.chunked_prefill_size",
        -1,
        "no chunked prefill: each prompt is prefilled in one pass, one dump",
        True,
    ),
    PairingSetting(
        f"{ROLLOUT}.enforce_eager",
        True,
        "SGLang without CUDA graphs (verl passes it as disable_cuda_graph): a pass replayed from a graph runs "
        "no module code, so msprobe would see nothing of it",
        False,
    ),
)

VLLM_PAIRING = (
    PairingSetting(
        f"{ROLLOUT}.max_num_seqs",
        1,
        "vLLM max_num_seqs=1: one request per engine step, so each prompt is prefilled alone (a batched "
        "prefill of the rollout.n requests of one prompt cannot be paired)",
        False,
    ),
    PairingSetting(
        f"{ROLLOUT}.enable_prefix_caching",
        False,
        "no prefix cache: the rollout.n requests share their prompt, and a cached prefix is not prefilled "
        "again, so its dump would hold only the prompt's tail",
        False,
    ),
    PairingSetting(
        f"{ROLLOUT}.enable_chunked_prefill",
        False,
        "no chunked prefill: each prompt is prefilled in one pass, one dump",
        False,
    ),
)
PAIRING = {"sglang": SGLANG_PAIRING, "vllm": VLLM_PAIRING}

# vLLM with chunked prefill off refuses to start when max_num_batched_tokens < max_model_len (its
# SchedulerConfig); verl's max_model_len unset is the model's max_position_embeddings.
VLLM_MODEL_LEN = f"{ROLLOUT}.max_model_len"
VLLM_BATCHED_TOKENS = f"{ROLLOUT}.max_num_batched_tokens"

# SGLang dumps one msprobe step per forward pass (its own debugger on native releases, sglang.model-runner's
# before): the generate side's `step` selects passes, not training steps.
# So does community vLLM's patched model runner (vllm.model-runner, one step per `execute_model` pass that
# serves requests) and vLLM-Ascend's. The consistency generate side's `step` selects passes, not training
# steps: [] dumps them all.
GENERATE_STEPS: list[int] = []
GENERATE_STEPS_WHY = {
    backend: f"{name} dumps one msprobe step per forward pass: step [0] would dump only the first pass (one "
    "prefill); step [] dumps every pass, and check-dump pairs each single-request prefill with its actor step"
    for backend, name in (("sglang", "SGLang"), ("vllm", "vLLM"))
}


def same_value(found: Any, wanted: Any) -> bool:
    """A script's value (a string from the command line, or YAML's) against the wanted one."""
    if isinstance(wanted, bool):
        return str(found).strip().lower() in (("true", "1", "yes", "on") if wanted else ("false", "0", "no", "off"))
    try:
        return bool(int(str(found).strip()) == wanted)
    except ValueError:
        return False
