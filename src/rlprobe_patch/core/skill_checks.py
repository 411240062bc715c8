"""The skill's `check-engine-patch.py` and `check-consistency-patch.py` rules, reproduced so that
users' existing checks keep working.

Same markers, same messages, same exit codes (0 PASS, 1 FAIL, 2 usage) as the skill's scripts.
One deliberate difference: the backend rule looks at the path *inside* the tree
(`verl/workers/engine/<backend>/...`), not at the whole path string, so a root such as
`/data/megatron-runs/verl` no longer triggers the Megatron rule for an FSDP check.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REQUIRED_MARKERS = [
    "_ensure_debugger",
    "_log_update_actor_step",
    "DUMP_ON",
    "update_actor_log.jsonl",
    "PrecisionDebugger",
]


@dataclass(frozen=True)
class SkillCheck:
    """One entry of the skill's report: `PASS: subject`, `INFO: subject` or `FAIL: subject` and its errors."""

    status: str  # PASS, FAIL or INFO
    subject: str
    errors: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [f"{self.status}: {self.subject}"] + [f"  - {e}" for e in self.errors]


@dataclass(frozen=True)
class SkillReport:
    """What a skill checker found, in its order; it prints as the skill prints (`lines`)."""

    checks: list[SkillCheck]

    @property
    def ok(self) -> bool:
        return all(c.status != "FAIL" for c in self.checks)

    def lines(self) -> list[str]:
        return [line for c in self.checks for line in c.lines()]

    def failures(self) -> dict[str, list[str]]:
        """Each FAIL subject (a path, or what is missing) with its errors."""
        return {c.subject: c.errors for c in self.checks if c.status == "FAIL"}

    def to_json(self) -> dict[str, Any]:
        """The `--json` document: the skill's exit code (0 PASS, 1 FAIL), each check, and the lines it prints."""
        return {
            "ok": self.ok,
            "exit_code": 0 if self.ok else 1,
            "checks": [asdict(c) for c in self.checks],
            "lines": self.lines(),
        }


def _checked(path: Path, errors: list[str]) -> SkillCheck:
    return SkillCheck("FAIL", str(path), errors) if errors else SkillCheck("PASS", str(path))


def engine_target(backend: str) -> str:
    return f"verl/workers/engine/{backend}/transformer_impl.py"


def check_engine_patch(verl_root: Path, backend: str) -> SkillReport:
    """The skill's check-engine-patch: one check, printed exactly as the skill prints it."""
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
    return SkillReport([_checked(path, errors)])


ENGINE_MARKERS = REQUIRED_MARKERS
VERL_CHECKS = {
    "verl/trainer/ppo/ray_trainer.py": ["PROMPTS_ONLY", "compute_prompts_only", "responses_len"],
    "verl/utils/debug/metrics.py": ["PROMPTS_ONLY", "skipping debug metrics"],
    "verl/trainer/ppo/rollout_corr_helper.py": ["PROMPTS_ONLY", "compute_rollout_correction_and_add_to_batch"],
}
REQUEST_ID_CHECKS = {
    "verl/workers/rollout/llm_server.py": ['extra_fields["request_id"]', "vllm_request_id"],
    "verl/experimental/agent_loop/agent_loop.py": ['extra_fields["request_id"]', "vllm_request_id"],
}
VLLM_CHECKS = {
    "vllm_ascend/worker/dispatch_logger.py": ["class DispatchLogger", "dispatch_log.jsonl"],
    "vllm_ascend/worker/model_runner_v1.py": ["DispatchLogger", "_finish_msprobe_step", "_dispatch_logger"],
}


def _markers_error(path: Path, markers: list[str]) -> str | None:
    if not path.exists():
        return f"missing file: {path}"
    text = path.read_text(encoding="utf-8", errors="replace")
    missing = [marker for marker in markers if marker not in text]
    return f"missing markers: {', '.join(missing)}" if missing else None


def check_consistency_patch(
    verl_root: Path, backend: str = "fsdp", vllm_ascend_root: Path | None = None, skip_vllm: bool = False
) -> SkillReport:
    """The skill's check-consistency-patch.py: its checks, printed as it prints them."""
    checks: list[SkillCheck] = []
    engine = Path(verl_root) / engine_target(backend)
    errors = [e for e in [_markers_error(engine, ENGINE_MARKERS)] if e]
    if engine.exists():
        text = engine.read_text(encoding="utf-8", errors="replace")
        if backend == "fsdp" and ("forward_backward_batch" not in text or "_debugger.start" not in text):
            errors.append("FSDP: expected dump hooks in forward_backward_batch")
        if backend == "megatron" and "_finish_dump_step" not in text and "_dump_should_record" not in text:
            errors.append("Megatron: expected _finish_dump_step hooks")
    checks.append(_checked(engine, errors))
    for rel, markers in VERL_CHECKS.items():
        path = Path(verl_root) / rel
        checks.append(_checked(path, [e for e in [_markers_error(path, markers)] if e]))
    request_id_ok = False
    for rel, markers in REQUEST_ID_CHECKS.items():
        path = Path(verl_root) / rel
        error = _markers_error(path, markers)
        if error is None:
            request_id_ok = True
            checks.append(SkillCheck("PASS", f"{path} (request_id)"))
        else:
            checks.append(SkillCheck("INFO", f"{path} not patched ({error})"))
    if not request_id_ok:
        checks.append(SkillCheck("FAIL", "request_id injection missing in both llm_server.py and agent_loop.py"))
    if not skip_vllm and vllm_ascend_root:
        checks += check_vllm_rules(vllm_ascend_root).checks
    return SkillReport(checks)


def check_vllm_rules(vllm_ascend_root: Path) -> SkillReport:
    """The vLLM-Ascend part of check-consistency-patch, for a vLLM-Ascend tree on its own."""
    checks = []
    for rel, markers in VLLM_CHECKS.items():
        path = Path(vllm_ascend_root) / rel
        checks.append(_checked(path, [e for e in [_markers_error(path, markers)] if e]))
    return SkillReport(checks)
