"""Shared payload parts (`patches/_shared/`, `src/rlprobe_patch/parts.py`): methods written once,
spliced verbatim into the payloads that take them, slots filled per payload.

That the assembled payloads insert exactly the text of before is proven by the cases
(`tests/unit/test_codemods.py`) and by the real cells' hashes (`tests/real/test_patched_bytes_real.py`)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import libcst as cst
import pytest

from rlprobe_patch.catalogue.patches import load_catalogue, patches_dir
from rlprobe_patch.codemod import PartError, Payload

SHARED = patches_dir() / "_shared"
WORKER_HOOKS = ["verl.fsdp-engine", "verl.megatron-engine", "verl.legacy-fsdp-workers", "verl.legacy-megatron-workers"]


def _methods(module: cst.Module) -> dict[str, str]:
    """{Class.method: code} of the methods written in a file's classes."""
    return {
        f"{cls.name.value}.{fn.name.value}": module.code_for_node(fn.with_changes(leading_lines=[]))
        for cls in module.body
        if isinstance(cls, cst.ClassDef)
        for fn in cst.ensure_type(cls.body, cst.IndentedBlock).body
        if isinstance(fn, cst.FunctionDef)
    }


def test_no_inserted_method_is_written_twice() -> None:
    """A method two payloads insert alike belongs in patches/_shared/, once."""
    written: dict[str, list[str]] = {}
    files = [p.folder / "payload.py" for p in load_catalogue()] + sorted(SHARED.glob("*.py"))
    for path in files:
        for name, code in _methods(cst.parse_module(path.read_bytes())).items():
            written.setdefault(code, []).append(f"{path.parent.name}: {name}")
    assert [where for where in written.values() if len(where) > 1] == []


def test_worker_hooks_take_their_helpers_from_the_shared_parts() -> None:
    for patch_id in WORKER_HOOKS:
        payload = Payload(patches_dir() / patch_id / "payload.py")
        assert payload.sources[1:] == (SHARED / "switches.py", SHARED / "worker_hooks.py"), patch_id
        (cls,) = [s for s in payload.module.body if isinstance(s, cst.ClassDef)]
        methods = payload.methods(cls.name.value)
        assert {"_ensure_debugger", "_log_update_actor_step", "_finish_dump_step"} <= {f.name.value for f in methods}
        assert "REQUEST_IDS" not in payload.module.code_for_node(cls)


SWITCH_READS = re.compile(r"""os\.(environ\.get|getenv)\(\s*"(DUMP_ON|DUMP_PHASE|PROMPTS_ONLY)\"""")
READERS = [
    *WORKER_HOOKS,
    "verl.prompts-only",
    "verl.debug-metrics",
    "verl.rollout-correction",
    "sglang.model-runner",
    "slime.megatron-actor",
    "slime.request-id",
]


@pytest.mark.parametrize("patch_id", READERS)
def test_every_hook_reads_the_switches_with_the_one_reader(patch_id: str) -> None:
    """Issue 15: no payload reads DUMP_ON / DUMP_PHASE / PROMPTS_ONLY itself; each takes the shared
    reader (spliced from patches/_shared/switches.py), and names its own patch and revision."""
    (patch,) = [p for p in load_catalogue() if p.id == patch_id]
    payload = Payload(patch.folder / "payload.py")
    assert SHARED / "switches.py" in payload.sources, patch_id
    code = payload.module.code
    assert not SWITCH_READS.search(code), patch_id
    reader = {fn.name.value: payload.module.code_for_node(fn) for fn in _all_methods(payload.module)}
    shared = _methods(cst.parse_module((SHARED / "switches.py").read_bytes()))
    if patch.package == "slime":  # slime's DUMP_PHASE is a list of its passes: its own _rlprobe_switches
        assert SHARED / "slime_switches.py" in payload.sources, patch_id
        shared.update(_methods(cst.parse_module((SHARED / "slime_switches.py").read_bytes())))
        shared["Switches._rlprobe_switches"] = shared["SlimeSwitches._rlprobe_switches"]
    if patch.package == "sglang":  # an SGLang server inherits verl's or slime's DUMP_PHASE: both grammars
        assert SHARED / "inference_switches.py" in payload.sources, patch_id
        shared.update(_methods(cst.parse_module((SHARED / "inference_switches.py").read_bytes())))
        shared["Switches._rlprobe_switches"] = shared["InferenceSwitches._rlprobe_switches"]
    for name in ("_rlprobe_switch", "_rlprobe_switches", "_rlprobe_run_switches"):
        assert reader[name] == shared[f"Switches.{name}"], (patch_id, name)
    announced = re.findall(r'_rlprobe_announce\("([^"]+)"', code)
    assert set(announced) <= {f"{patch.id} r{patch.revision}"}, (patch_id, announced)
    if "_rlprobe_debugger(" in code:
        assert announced, patch_id


def _all_methods(module: cst.Module) -> list[cst.FunctionDef]:
    return [
        fn
        for cls in module.body
        if isinstance(cls, cst.ClassDef)
        for fn in cst.ensure_type(cls.body, cst.IndentedBlock).body
        if isinstance(fn, cst.FunctionDef)
    ]


@pytest.fixture
def catalogue_copy(tmp_path: Path) -> Path:
    """The worker hooks' payloads and the shared parts, copied to be edited."""
    for patch_id in WORKER_HOOKS:
        (tmp_path / patch_id).mkdir()
        shutil.copy(patches_dir() / patch_id / "payload.py", tmp_path / patch_id)
    shutil.copytree(SHARED, tmp_path / "_shared")
    return tmp_path


def test_a_log_format_change_is_one_edit(catalogue_copy: Path) -> None:
    shared = catalogue_copy / "_shared" / "worker_hooks.py"
    text = shared.read_text()
    new = '            "pid": os.getpid(),\n            "phase": self._dump_phase,\n'
    # two log formats: UpdateActorLog (the loop hooks) and PipelineSteps (the Megatron hooks, whose
    # line also names the micro-batch, chunk, stage and passes of its step)
    assert text.count('            "pid": os.getpid(),\n') == 2
    shared.write_text(text.replace('            "pid": os.getpid(),\n', new))
    for patch_id in WORKER_HOOKS:
        module = Payload(catalogue_copy / patch_id / "payload.py").module
        (log,) = [code for name, code in _methods(module).items() if name.endswith("._log_update_actor_step")]
        assert '"pid": os.getpid(),\n        "phase": self._dump_phase,\n' in log, patch_id


def test_a_slot_fill_puts_its_comments_above_the_line(catalogue_copy: Path) -> None:
    module = Payload(catalogue_copy / "verl.legacy-megatron-workers" / "payload.py").module
    (log,) = [code for name, code in _methods(module).items() if name.endswith("._log_update_actor_step")]
    assert (
        "    # MegatronPPOActor has no self.rank.\n"
        "    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0\n"
    ) in log
    assert (
        "    # A TensorDict micro-batch: request ids only when the batch carries them.\n"
        '    request_ids = micro_batch.get("request_id", None) if "request_id" in micro_batch.keys() else None\n'
    ) in log


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s.replace("\ndef RANK(", "\ndef RANK_UNUSED("), "no fill for the slot RANK"),
        (lambda s: s.replace("    return torch.distributed", "    x = 1\n    return torch.distributed"), "one `return"),
        (
            lambda s: s.replace("_should_dump = PipelineSteps._should_dump", "_dump = PipelineSteps._should_dump"),
            "keeps its",
        ),
        (lambda s: s.replace("= PipelineSteps._should_dump", "= EngineDebugger._should_dump"), "no method"),
    ],
    ids=["missing fill", "fill not one return", "renamed", "unknown method"],
)
def test_a_wrong_part_or_fill_is_refused(catalogue_copy: Path, edit, message: str) -> None:
    payload = catalogue_copy / "verl.megatron-engine" / "payload.py"
    payload.write_text(edit(payload.read_text()))
    with pytest.raises(PartError, match=message):
        Payload(payload)
