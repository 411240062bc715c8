"""core/plan.py and core/selection.py, without the CLI: what a plan decides, in memory only.

On our fixture trees of verl 0.9 and 0.6 and the real catalogue: a plan writes nothing, holds
exactly the files it changes (original -> patched), says "already applied" once the tree holds
its result, refuses a drifted site with the anchor's reason, and compiles what it generates; a
selection picks each tree's patches the way `apply` asks for them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import snapshot
from unidiff import PatchSet

from rlprobe_patch.base.errors import ExitCode, RefusedError, UsageError
from rlprobe_patch.base.fsio import sha256
from rlprobe_patch.catalogue.trees import Tree, find_tree
from rlprobe_patch.codemod import State
from rlprobe_patch.core.plan import Change, plan_apply, raise_if_refused, show_params
from rlprobe_patch.core.selection import Selection, select_trees, wants_trainer

FSDP = "verl/workers/engine/fsdp/transformer_impl.py"
MEGATRON = "verl/workers/engine/megatron/transformer_impl.py"


@pytest.fixture
def tree(fixture_tree) -> Tree:
    return find_tree("verl", fixture_tree("0.9"))


def test_a_plan_changes_nothing_on_disk_and_holds_exactly_its_files(tree: Tree) -> None:
    before = snapshot(tree.root)
    plan = plan_apply(tree, Selection("fsdp"), {})
    assert snapshot(tree.root) == before and not (tree.root / ".rlprobe-patch").exists()
    (p,) = plan.patches
    assert p.patch.id == "verl.fsdp-engine" and p.state is State.APPLICABLE and p.targets == [FSDP]
    assert set(plan.files) == set(plan.changes) == set(plan.writes) == {FSDP}
    change = plan.files[FSDP]
    assert change.before == change.current == (tree.root / FSDP).read_bytes() and change.after != change.before
    assert change.mode == (tree.root / FSDP).stat().st_mode & 0o7777
    compile(change.after or b"", FSDP, "exec")  # what it would write compiles
    assert plan.inputs == {FSDP: sha256(change.before or b"")} and plan.inputs_unchanged()
    (patched,) = PatchSet(plan.diff())
    assert patched.path == FSDP and patched.added > 0 and patched.removed == 0  # hooks are inserted, nothing lost
    assert plan.diff() == plan.record_diff()  # not an upgrade: the record is what the write does


def test_a_plan_on_its_own_result_is_already_applied(tree: Tree) -> None:
    plan = plan_apply(tree, Selection("fsdp"), {})
    (tree.root / FSDP).write_bytes(plan.files[FSDP].after or b"")
    again = plan_apply(tree, Selection("fsdp"), {})
    assert [p.state for p in again.patches] == [State.APPLIED]
    assert again.files == {} and not again.needs_write and again.refused == []
    assert len(again.checked) == 1  # the final bytes, found APPLIED, for verify's memo


def test_a_changed_input_is_noticed_before_writing(tree: Tree) -> None:
    plan = plan_apply(tree, Selection("fsdp"), {})
    (tree.root / FSDP).write_text((tree.root / FSDP).read_text() + "\n# edited meanwhile\n")
    assert not plan.inputs_unchanged()


def test_a_drifted_site_is_refused_with_the_anchors_reason(tree: Tree) -> None:
    path = tree.root / FSDP
    path.write_bytes(path.read_bytes().replace(b"def forward_backward_batch", b"def renamed_batch"))
    plan = plan_apply(tree, Selection("fsdp"), {})
    (p,) = plan.refused
    assert p.state is State.DRIFTED and any("forward_backward_batch" in r for r in p.reasons)
    assert p.reasons[-1].startswith("nothing was written; if this release moved code, verl.fsdp-engine needs")
    with pytest.raises(RefusedError) as refused:
        raise_if_refused(plan)
    assert refused.value.exit_code == ExitCode.REFUSED
    assert refused.value.details[0].startswith("verl.fsdp-engine: ")


def test_a_set_is_refused_whole_when_one_of_its_patches_cannot_take_the_tree(tree: Tree) -> None:
    """The fixture holds verl's engine files only: the consistency set's other files are missing."""
    plan = plan_apply(tree, Selection("fsdp", "consistency"), {})
    states = {p.patch.id: p.state for p in plan.patches}
    assert states["verl.fsdp-engine"] is State.APPLICABLE
    missing = [p for p in plan.refused if any("missing" in r for r in p.reasons)]
    assert {p.patch.id for p in missing} >= {"verl.request-id", "verl.prompts-only"}
    with pytest.raises(RefusedError, match="nothing was written"):
        raise_if_refused(plan)


def test_parameters_are_baked_in_and_a_different_one_is_refused(tree: Tree) -> None:
    plan = plan_apply(tree, Selection("fsdp"), {"msprobe_config": "/etc/mine.json"})
    assert b"/etc/mine.json" in (plan.files[FSDP].after or b"")
    assert show_params(plan.patches[0].params) == "--msprobe-config /etc/mine.json"
    (tree.root / FSDP).write_bytes(plan.files[FSDP].after or b"")
    other = plan_apply(tree, Selection("fsdp"), {"msprobe_config": "/etc/other.json"})
    (p,) = other.refused
    assert "already applied with --msprobe-config /etc/mine.json, not --msprobe-config /etc/other.json" in p.reasons[0]


def test_a_release_outside_the_range_is_skipped_in_a_set_refused_alone_and_tried_with_force(fixture_tree) -> None:
    old = find_tree("verl", fixture_tree("0.6"))
    in_set = plan_apply(old, Selection("fsdp", "consistency", worker_impl="legacy"), {})
    skipped = [p for p in in_set.patches if p.skipped]
    assert skipped and all(p.state is None and not p.reasons for p in skipped)
    alone = plan_apply(old, Selection("fsdp", only=(skipped[0].patch.id,)), {})
    assert alone.refused and alone.refused[0].reasons[0].startswith("unsupported release: ")
    forced = plan_apply(old, Selection("fsdp", only=(skipped[0].patch.id,)), {}, force=True)
    assert forced.patches[0].notices[0].startswith("--force: ")


def test_change_recorded_and_written() -> None:
    assert Change("f", b"a", b"b", 0o644, b"a").recorded and Change("f", b"a", b"b", 0o644, b"a").written
    upgrade = Change("f", b"orig", b"r2", 0o644, b"r1")  # recorded from the original, written from r1
    assert upgrade.recorded and upgrade.written
    back = Change("f", b"orig", b"orig", 0o644, b"r1")  # an upgrade that ends where the tree began
    assert not back.recorded and back.written


# -- selection ---------------------------------------------------------------------------------------
def test_selection_picks_the_backend_hook_or_a_modes_set() -> None:
    assert [p.id for p in Selection("fsdp").patches("verl")] == ["verl.fsdp-engine"]
    assert [p.id for p in Selection("megatron").patches("verl")] == ["verl.megatron-engine"]
    assert [p.id for p in Selection("fsdp", worker_impl="legacy").patches("verl")] == ["verl.legacy-fsdp-workers"]
    consistency = {p.id for p in Selection("fsdp", "consistency").patches("verl")}
    assert "verl.fsdp-engine" in consistency and "verl.request-id" in consistency
    assert "verl.megatron-engine" not in consistency
    without = {p.id for p in Selection("fsdp", "consistency", skip=("verl.request-id",)).patches("verl")}
    assert without == consistency - {"verl.request-id"}
    with pytest.raises(RefusedError, match=r"unknown patch id: verl\.nope"):
        Selection("fsdp", only=("verl.nope",)).patches("verl")
    assert Selection("fsdp", only=("verl.request-id",)).explicit and not Selection("fsdp", "consistency").explicit


def test_select_trees_needs_a_backend_for_verl_and_follows_only(fixture_tree) -> None:
    verl = find_tree("verl", fixture_tree("0.9"))
    with pytest.raises(UsageError, match="--backend is required to patch verl") as usage:
        select_trees([verl], backend=None, mode=None)
    assert usage.value.exit_code == ExitCode.USAGE
    (chosen,) = select_trees([verl], backend="fsdp", mode=None, worker_impl="auto")
    assert chosen.selection.backend == "fsdp" and chosen.selection.worker_impl == "engine"
    assert chosen.worker_path is not None and chosen.worker_path["impl"] == "engine"
    (legacy,) = select_trees([verl], backend="fsdp", mode=None, worker_impl="legacy")
    assert legacy.worker_path == {"impl": "legacy", "why": "--worker-impl legacy"}
    with pytest.raises(RefusedError, match="no patch selected for the trees given"):
        select_trees([verl], backend="fsdp", mode=None, only=("sglang.model-runner",))


def test_select_trees_reads_the_run_only_with_a_script(fixture_tree, tmp_path: Path) -> None:
    verl = find_tree("verl", fixture_tree("0.9"))
    asked: list[Tree] = []

    def facts(tree: Tree) -> dict:
        asked.append(tree)
        return {"rollout_tp": (2, "run.sh:3")}

    select_trees([verl], backend="fsdp", mode=None, read_facts=facts)
    assert asked == []  # no script, nothing read
    (chosen,) = select_trees([verl], backend="fsdp", mode=None, script=tmp_path / "run.sh", read_facts=facts)
    assert asked == [verl] and chosen.selection.facts == {"rollout_tp": 2}


def test_wants_trainer() -> None:
    assert wants_trainer(None, ())  # the bare engine hook
    assert not wants_trainer("inference", ())
    assert wants_trainer("inference", ("verl.request-id",)) and wants_trainer(None, ("slime.request-id",))
    assert not wants_trainer(None, ("sglang.model-runner",))
