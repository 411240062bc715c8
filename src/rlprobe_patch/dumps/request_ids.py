"""The request ids the hooks write (vLLM's dispatch logs, the rollout record) spelled as verl sent them."""

from __future__ import annotations

import re

_VLLM_SUFFIX = re.compile(r"-[0-9a-f]{8}$")  # vLLM >= 0.14 appends it to the id it was sent
_PD_SUFFIX = re.compile(r"_[PD]$")  # prefill / decode instance of a disaggregated request


def strip_vllm_suffix(request_id: str) -> str:
    """The id verl sent: without vLLM's `-<8 hex>` and the `_P` / `_D` suffix, in either order."""
    stripped = _VLLM_SUFFIX.sub("", request_id)
    without_pd = _PD_SUFFIX.sub("", stripped)
    return _VLLM_SUFFIX.sub("", without_pd) if without_pd != stripped else stripped
