"""The skill's `check-engine-patch.py` rules, reproduced so that users' existing checks keep working.

Same markers, same messages, same exit codes (0 PASS, 1 FAIL, 2 usage) as the skill's script.
One deliberate difference: the backend rule looks at the path *inside* the tree
(`verl/workers/engine/<backend>/...`), not at the whole path string, so a root such as
`/data/megatron-runs/verl` no longer triggers the Megatron rule for an FSDP check.
"""

from __future__ import annotations

from pathlib import Path

REQUIRED_MARKERS = [
    "_ensure_debugger",
    "_log_update_actor_step",
    "DUMP_ON",
    "update_actor_log.jsonl",
    "PrecisionDebugger",
]


def engine_target(backend: str) -> str:
    return f"verl/workers/engine/{backend}/transformer_impl.py"


def check_engine_patch(verl_root: Path, backend: str) -> tuple[bool, list[str]]:
    """(passed, output lines) exactly as the skill prints them."""
    rel = engine_target(backend)
    path = Path(verl_root) / rel
    errors = []
    if not path.exists():
        errors.append(f"missing file: {path}")
    else:
        text = path.read_text(encoding="utf-8", errors="replace")
        missing = [marker for marker in REQUIRED_MARKERS if marker not in text]
        if missing:
            errors.append(f"missing markers: {', '.join(missing)}")
        if "fsdp" in rel and ("forward_backward_batch" not in text or "_debugger.start" not in text):
            errors.append("FSDP: expected dump hooks in forward_backward_batch")
        if "megatron" in rel and "_finish_dump_step" not in text and "_dump_should_record" not in text:
            errors.append("Megatron: expected _finish_dump_step or _dump_should_record hooks")
    if errors:
        return False, [f"FAIL: {path}"] + [f"  - {e}" for e in errors]
    return True, [f"PASS: {path}"]
