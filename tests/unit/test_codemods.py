"""The codemods: before/after cases from the catalogue, and the laws every patch obeys.

Cases live beside each patch (`patches/<id>/cases/<name>/`), the way LibCST's
`CodemodTest.assertCodemod(before, after, expected_warnings=...)` tests read: `before.py`, and
`case.toml` naming the release the slice comes from. A case that applies has `after.py`, and
the notices and warnings apply prints for that release are checked against `case.toml`'s
`notices` and `warnings` (none when absent). A refusal case has no `after.py`: its `refused`
is the reason the patch gives for not touching the file.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import libcst as cst
import pytest
from conftest import REPO
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from packaging.version import Version

from rlprobe_patch.catalogue.patches import load_catalogue
from rlprobe_patch.codemod import CreateFile, State

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

ENGINE_PATCHES = [p for p in load_catalogue() if p.id in ("verl.fsdp-engine", "verl.megatron-engine")]


def case_codemod(patch, case: Path):
    """A case names its site's codemod class in `cases/<name>/site` (default: the first site)."""
    name = (case / "site").read_text().strip() if (case / "site").is_file() else patch.sites[0].codemod_class
    return patch.codemod(next(site for site in patch.sites if site.codemod_class == name))


def case_toml(case: Path) -> dict[str, Any]:
    return tomllib.loads((case / "case.toml").read_text(encoding="utf-8"))


ALL_CASES = [(p, case) for p in load_catalogue() for case in sorted((p.folder / "cases").iterdir())]
CASES = [(p, case) for p, case in ALL_CASES if (case / "after.py").is_file()]
REFUSALS = [(p, case) for p, case in ALL_CASES if "refused" in case_toml(case)]
FIXTURE_TARGETS = [
    (p.codemod(p.sites[0]), family / p.sites[0].target)
    for p in ENGINE_PATCHES
    for family in sorted((REPO / "fixtures").glob("verl-*"))  # every bundled fixture tree, discovered
]


@pytest.mark.parametrize(("patch", "case"), CASES, ids=[f"{p.id}/{c.name}" for p, c in CASES])
def test_case(patch, case: Path) -> None:
    codemod = case_codemod(patch, case)
    before = (case / "before.py").read_bytes()
    after = (case / "after.py").read_bytes()
    module = cst.parse_module(before)
    assert codemod.state(module).state is State.APPLICABLE
    patched = codemod.insert(module)
    assert patched.bytes == after
    assert codemod.state(cst.parse_module(after)).state is State.APPLIED
    assert codemod.strip(cst.parse_module(after)).bytes == before
    compile(after, str(case / "after.py"), "exec")
    # What apply says about this release, checked like LibCST's expected_warnings.
    meta = case_toml(case)
    version = Version(meta["release"])
    assert patch.supports(version)
    assert patch.notices_for(version, case) == meta.get("notices", [])  # no tree here: no override notices
    assert patch.warnings_for(version) == meta.get("warnings", [])


@pytest.mark.parametrize(("patch", "case"), REFUSALS, ids=[f"{p.id}/{c.name}" for p, c in REFUSALS])
def test_refusal_case(patch, case: Path) -> None:
    """The patch refuses the file with the reason the case names, and takes nothing out of it."""
    codemod = case_codemod(patch, case)
    before = (case / "before.py").read_bytes()
    meta = case_toml(case)
    assert not (case / "after.py").exists()
    assert patch.supports(Version(meta["release"]))
    report = codemod.state(cst.parse_module(before))
    assert report.state is State.DRIFTED
    assert list(report.reasons) == [meta["refused"]]


def test_every_patch_has_cases_and_a_payload_that_compiles() -> None:
    for patch in load_catalogue():
        cases = [case for p, case in CASES if p.id == patch.id]  # ids: another test may reload the catalogue
        assert len(cases) >= 2, patch.id
        assert any(p.id == patch.id for p, _ in REFUSALS), f"{patch.id}: no refusal case"
        for case in (case for p, case in ALL_CASES if p.id == patch.id):  # each case applies or is refused
            assert (case / "before.py").is_file() and "release" in case_toml(case), case
            assert (case / "after.py").is_file() != ("refused" in case_toml(case)), case
        for site in patch.sites:  # every site that edits a file has a case
            if isinstance(patch.codemod(site), CreateFile):
                continue
            assert any(type(case_codemod(patch, case)) is type(patch.codemod(site)) for case in cases), (patch.id, site)
            assert patch.codemod(site).DESCRIPTION
        compile((patch.folder / "payload.py").read_text(), str(patch.folder / "payload.py"), "exec")


def _variants(source: str, newline: str, indent: str, trailing_newline: bool) -> str:
    lines = source.split("\n")
    out = [re.sub(r"^((?:    )+)", lambda mt: indent * (len(mt.group(1)) // 4), line) for line in lines]
    text = newline.join(out)
    return text if trailing_newline else text.rstrip(newline)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    target=st.sampled_from(FIXTURE_TARGETS),
    newline=st.sampled_from(["\n", "\r\n"]),
    indent=st.sampled_from(["    ", "  ", "\t", "        "]),
    trailing_newline=st.booleans(),
)
def test_laws_hold_for_any_formatting(target, newline: str, indent: str, trailing_newline: bool) -> None:
    """apply∘apply = apply, strip∘apply = identity (bytes), and the inserted code follows the
    file's own line endings, indentation and trailing newline."""
    codemod, path = target
    source = _variants(path.read_text(), newline, indent, trailing_newline)
    module = cst.parse_module(source.encode())
    patched = codemod.insert(module)
    text = patched.code
    assert codemod.state(patched).state is State.APPLIED
    assert codemod.strip(patched).code == source
    assert text.endswith(newline) == trailing_newline
    if newline == "\r\n":
        assert "\n" not in text.replace("\r\n", "")
    assert re.search(r"^" + re.escape(indent * 2) + r"if getattr\(self, \"_debugger\", None\)", text, re.M)
    compile(text, str(path), "exec")
    # Applying again to the patched tree changes nothing: the state says so, never a failed attempt.
    assert codemod.insert(codemod.strip(patched)).code == text


@pytest.mark.parametrize(("codemod", "path"), FIXTURE_TARGETS)
def test_reformatted_patched_file_is_still_applied(codemod, path: Path) -> None:
    """State is decided from the syntax tree: reflowing the inserted code does not make it drift."""
    patched = codemod.insert(cst.parse_module(path.read_bytes())).code
    reflowed = patched.replace(
        'self._update_actor_logger_fp = open(os.path.join(log_dir, "update_actor_log.jsonl"), "a", encoding="utf-8")',
        'self._update_actor_logger_fp = open(\n                os.path.join(log_dir, "update_actor_log.jsonl"),\n'
        '                "a",\n                encoding="utf-8",\n            )',
    ).replace("  # rlprobe-patch", "")
    assert reflowed != patched
    assert codemod.state(cst.parse_module(reflowed)).state is State.APPLIED


@pytest.mark.parametrize(("codemod", "path"), FIXTURE_TARGETS)
def test_partial_or_edited_hooks_drift(codemod, path: Path) -> None:
    patched = codemod.insert(cst.parse_module(path.read_bytes())).code
    edited = patched.replace("self._debugger.step()", "self._debugger.step()\n        print('hi')", 1)
    report = codemod.state(cst.parse_module(edited))
    assert report.state is State.DRIFTED
    assert "edited after apply" in report.reasons[0]
    # A hand-applied hook that no longer matches ours: the patch must not be laid over it twice.
    half = patched.replace("    def _finish_dump_step(self", "    def _finish_dump_step_renamed(self", 1)
    assert codemod.state(cst.parse_module(half)).state is State.DRIFTED


def test_ambiguous_and_missing_anchors_name_the_place() -> None:
    patch = next(p for p in load_catalogue() if p.id == "verl.fsdp-engine")
    codemod = patch.codemod(patch.sites[0])
    source = (REPO / "fixtures/verl-0.9" / patch.sites[0].target).read_text()
    loop = "        for micro_batch_idx, micro_batch in enumerate(micro_batches):\n"
    twice = source.replace(loop, "        for micro_batch in micro_batches:\n            pass\n" + loop)
    report = codemod.state(cst.parse_module(twice))
    assert report.state is State.DRIFTED
    assert "FSDPEngine.forward_backward_batch" in report.reasons[0] and "2 (ambiguous)" in report.reasons[0]
    gone = source.replace("    def forward_backward_batch(self", "    def forward_backward(self")
    report = codemod.state(cst.parse_module(gone))
    assert (
        report.state is State.DRIFTED
        and "class FSDPEngine: expected one method `forward_backward_batch`" in (report.reasons[0])
    )
    clash = source.replace(
        "    def forward_step(self, micro_batch",
        "    def _ensure_debugger(self):\n        pass\n\n    def forward_step(self, micro_batch",
        1,
    )
    report = codemod.state(cst.parse_module(clash))
    assert report.state is State.DRIFTED
