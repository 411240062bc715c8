"""What check-dump needs from an SGLang rollout to pair its prefills with actor micro-batches by rid.

One table, read by `script` (which sets the values), `detect` (which says which ones the script
already has) and `config` (which writes the generate side's msprobe config for it).
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

# SGLang dumps one msprobe step per forward pass (its own debugger on native releases, sglang.model-runner's
# before): the generate side's `step` selects passes, not training steps.
SGLANG_GENERATE_STEPS: list[int] = []
SGLANG_GENERATE_STEPS_WHY = (
    "SGLang dumps one msprobe step per forward pass: step [0] would dump only the first pass (one prefill); "
    "step [] dumps every pass, and check-dump pairs each single-request prefill with its actor step"
)


def same_value(found: Any, wanted: Any) -> bool:
    """A script's value (a string from the command line, or YAML's) against the wanted one."""
    if isinstance(wanted, bool):
        return str(found).strip().lower() in (("true", "1", "yes", "on") if wanted else ("false", "0", "no", "off"))
    try:
        return bool(int(str(found).strip()) == wanted)
    except ValueError:
        return False
