"""Which engine serves verl's `rollout.name=vllm` in an environment, and whether it dumps.

verl passes the rollout's msprobe config as `engine_kwargs.vllm.additional_config.dump_config_path`
(`dump_config` before vLLM-Ascend 0.13). vLLM-Ascend's NPUModelRunner reads that key; community
vLLM (NVIDIA GPUs) reads it only once the catalogue's vLLM patches are applied to it (its model
runner's debugger; in consistency mode also the dispatch log check-dump pairs by). Where vLLM-Ascend is installed it is
the engine (it runs on top of vLLM and is not hooked a second time). The engine comes from the
`--python` environment (find_spec and metadata: nothing is imported), else from the version the
user names (`--vllm-version` / `--vllm-ascend-version`), else it is unknown.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlprobe_patch.base.errors import PatchError
from rlprobe_patch.base.interpreter import Package
from rlprobe_patch.catalogue.patches import load_catalogue
from rlprobe_patch.catalogue.trees import find_tree
from rlprobe_patch.core.status import status

ASCEND = "vllm-ascend"
COMMUNITY = "vllm"


@dataclass
class VllmEngine:
    """The engine behind `rollout.name=vllm`: vLLM-Ascend, community vLLM, or unknown."""

    kind: str  # ASCEND, COMMUNITY or "unknown"
    version: str | None = None
    root: Path | None = None  # the community vLLM tree the environment imports
    states: dict[str, str] = field(default_factory=dict)  # community vLLM: patch id -> state
    why: str = ""

    @staticmethod
    def dumper() -> str:
        """The patch that gives community vLLM its msprobe debugger (the one its inference mode takes)."""
        return next(p.id for p in load_catalogue() if p.package == "vllm" and "inference" in p.modes)

    def needed(self, mode: str) -> list[str]:
        """The patches community vLLM needs to dump in `mode` (none for the other engines)."""
        if self.kind != COMMUNITY:
            return []
        return [p.id for p in load_catalogue() if p.package == "vllm" and mode in p.modes]

    def missing(self, mode: str) -> list[str]:
        """The needed patches not applied in the tree (all of them when the tree is not seen)."""
        return [pid for pid in self.needed(mode) if self.states.get(pid) != "applied"]

    def describe(self) -> str:
        if self.kind == ASCEND:
            return f"vLLM-Ascend {self.version or '?'}: dumps with its own msprobe debugger ({self.why})"
        if self.kind == COMMUNITY:
            hooked = self.states.get(self.dumper())
            state = f"{self.dumper()} {hooked}" if hooked else "its tree was not seen"
            dumps = "dumps" if hooked == "applied" else f"dumps nothing until {self.dumper()} is applied"
            return f"community vLLM {self.version or '?'} ({self.why}): {dumps} ({state})"
        return f"unknown ({self.why})"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "version": self.version,
            "root": str(self.root) if self.root else None,
            "patches": self.states,
            "dumps": self.kind == ASCEND or self.states.get(self.dumper()) == "applied",
            "why": self.why,
        }


def vllm_engine(
    found: dict[str, Package] | None,
    python: str | None,
    vllm_version: str | None = None,
    vllm_ascend_version: str | None = None,
) -> VllmEngine:
    """The engine from the versions named, else from what `python` has installed (`found`)."""
    if vllm_ascend_version:
        return VllmEngine(ASCEND, vllm_ascend_version, why="--vllm-ascend-version")
    if found is not None and found["vllm_ascend"].found:
        return VllmEngine(ASCEND, found["vllm_ascend"].version, why=f"installed in {python or 'this Python'}")
    if found is not None and found["vllm"].found:
        engine = VllmEngine(COMMUNITY, vllm_version or found["vllm"].version, why=f"in {python or 'this Python'}")
        try:
            tree = find_tree("vllm", None, python)
            engine.root, engine.version = tree.root, vllm_version or str(tree.version)
            engine.states = {p.patch.id: p.state_name for p in status(tree).patches}
        except PatchError as exc:
            engine.why += f"; its tree: {exc.message}"
        return engine
    if vllm_version:
        return VllmEngine(COMMUNITY, vllm_version, why="--vllm-version; its tree was not seen")
    return VllmEngine("unknown", why="no --python environment with vLLM, no --vllm-version / --vllm-ascend-version")
