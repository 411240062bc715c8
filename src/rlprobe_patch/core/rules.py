"""Package rules above the transaction core, read from the catalogue and the release data.

- Which worker path a run takes (`resolve_worker_impl`, from `patches/releases/<package>.toml`'s
  `[[worker_path]]` and the run's settings read from its launch script), and which paths the
  records hooked.
- The skill's own checkers that `verify` runs beside ours, per package (`SKILL_RULES`).

The rest of the core (plan, apply, verify, revert, status) and the record layer name no package;
what differs per package lives here and in `patches/`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rlprobe_patch.catalogue.patches import Patch, get_patch, select
from rlprobe_patch.catalogue.releases import releases
from rlprobe_patch.catalogue.trees import Tree
from rlprobe_patch.core.checks import Check
from rlprobe_patch.core.skill_checks import check_consistency_patch, check_engine_patch, check_vllm_rules, engine_target
from rlprobe_patch.record.folder import Record

RunFacts = dict[str, tuple[Any, str]]  # {fact: (value, source)} of a training run (`launch.script.run_facts`)


def resolve_worker_impl(
    tree: Tree, requested: str, script: Path | None = None, facts: RunFacts | None = None
) -> tuple[str, str]:
    """Which worker path the user's PPO actor takes, and why: ("engine" | "legacy", reason).

    From the release data's `[[worker_path]]` ranges, and the run's setting they name when a script was read."""
    if requested != "auto":
        return requested, f"--worker-impl {requested}"
    path = releases(tree.package).worker_path(tree.version)
    if not path.setting or script is None or facts is None:
        return path.impl, path.why.format(version=tree.version)
    setting, source = facts.get(path.setting, (None, "not in this release's config"))
    setting = str(setting).lower() if setting is not None else None
    key = f"trainer.{path.setting}={setting}"
    if setting == path.engine_when:
        return "engine", f"{script} runs with {key} ({source}): the engine workers"
    return path.impl, f"{script} runs with {key} ({source}): the {path.impl} workers run the PPO actor"


def has_worker_paths(package: str) -> bool:
    return bool(releases(package).worker_paths)


def hooked_worker_paths(records: list[Record]) -> list[str]:
    """The worker paths ("engine", "legacy") whose hooks the records applied."""
    impls = {get_patch(i).worker_impl for r in records for i in r.patch_ids}
    backend_hooks = {i for r in records for i in r.patch_ids if "any" not in get_patch(i).backends}
    return sorted(impl for impl in impls if any(get_patch(i).worker_impl == impl for i in backend_hooks))


def worker_path_checks(tree: Tree, records: list[Record], run: tuple[Path, RunFacts] | None) -> list[Check]:
    checks = []
    paths = hooked_worker_paths(records)
    if paths:
        checks.append(Check("worker path hooked", True, ", ".join(paths)))
    if run is not None and has_worker_paths(tree.package) and paths:
        impl, why = resolve_worker_impl(tree, "auto", run[0], run[1])
        detail = why if impl in paths else f"{why}; hooked: {', '.join(paths)}: the run would dump nothing"
        checks.append(Check(f"worker path of {run[0].name}", impl in paths, detail))
    return checks


SkillRule = Callable[[Tree, list[Patch], Mapping[str, Path]], tuple[list[Check], list[str]]]


def _trainer_rules(tree: Tree, patches: list[Patch], others: Mapping[str, Path]) -> tuple[list[Check], list[str]]:
    """The skill's check-engine-patch and, when the consistency set is applied, check-consistency-patch
    (which also reads the vLLM-Ascend tree verified with it, if any)."""
    vllm_ascend_root = others.get("vllm_ascend")
    checks: list[Check] = []
    skill_lines: list[str] = []
    # The skill's engine check applies to the engine hooks; legacy worker hooks live elsewhere.
    engines = sorted({b for p in patches if p.worker_impl == "engine" for b in p.backends if b in ("fsdp", "megatron")})
    legacy = sorted({b for p in patches if p.worker_impl == "legacy" for b in p.backends if b in ("fsdp", "megatron")})
    for b in engines:
        engine = check_engine_patch(tree.root, b)
        lines = engine.lines()
        skill_lines += lines
        checks.append(Check(f"skill check-engine-patch --backend {b}", engine.ok, "; ".join(lines[1:])))
    if any("consistency" in p.modes and "any" in p.backends and p.skill_checked for p in patches):
        # The skill's rules expect every patch of the set; a release that cannot take one of
        # them fails those rules by design (its target, and the lines the release data names),
        # and so does a tree given only part of the set (`apply --only`): the rules of the patches
        # not applied. Such FAIL lines are shown, and do not fail verify.
        applied = {p.id for p in patches}
        by_design = [p for p in select(tree.package, "fsdp", "consistency") if not p.supports(tree.version)]
        absent = [
            p
            for p in select(tree.package, "fsdp", "consistency")
            if "any" in p.backends and p.skill_checked and p.supports(tree.version) and p.id not in applied
        ]
        expected_fail = {str(tree.root / t) for p in by_design for t in p.targets}
        expected_fail |= {line for p in by_design for line in releases(tree.package).expected_checker_fails(p.id)}
        for b in engines or legacy or ["fsdp"]:
            expected = set(expected_fail)
            if b not in engines:  # the legacy workers (or no worker hook) instead of the engine file the skill checks
                expected.add(str(tree.root / engine_target(b)))
            consistency = check_consistency_patch(
                tree.root, b, vllm_ascend_root=vllm_ascend_root, skip_vllm=vllm_ascend_root is None
            )
            skill_lines += consistency.lines()
            failed = consistency.failures()
            unexpected = [
                f"{subject} ({'; '.join(errors)})" if errors else subject
                for subject, errors in failed.items()
                if subject not in expected and not _about(subject, absent, tree.root)
            ]
            why = [f"{tree.package} {tree.version} cannot take a patch"] if by_design else []
            why += ["the legacy workers are hooked"] if legacy and b not in engines else []
            why += ["the worker hook is not applied"] if not engines and not legacy else []
            why += [f"not applied: {', '.join(p.id for p in absent)}"] if absent else []
            detail = "; ".join(unexpected) or (
                f"FAIL only where the set is not whole ({'; '.join(why)}): " + ", ".join(failed) if failed else ""
            )
            checks.append(Check(f"skill check-consistency-patch --backend {b}", not unexpected, detail))
    return checks, skill_lines


def _about(subject: str, patches: list[Patch], root: Path) -> bool:
    """Whether a FAIL subject of the skill's checker is a target of one of `patches` (its path, or its file
    named in a line such as "request_id injection missing in both llm_server.py and agent_loop.py")."""
    for patch in patches:
        for target in patch.targets:
            if subject == str(root / target) or Path(target).name in subject.split():
                return True
    return False


def _dispatch_logger_rules(
    tree: Tree, patches: list[Patch], others: Mapping[str, Path]
) -> tuple[list[Check], list[str]]:
    if not patches:
        return [], []
    found = check_vllm_rules(tree.root)
    lines = found.lines()
    return [Check("skill check-consistency-patch vLLM-Ascend rules", found.ok, "; ".join(lines[1:]))], lines


# The skill's checkers, by the package whose tree they read.
SKILL_RULES: dict[str, SkillRule] = {"verl": _trainer_rules, "vllm_ascend": _dispatch_logger_rules}


def package_checks(
    tree: Tree,
    patches: list[Patch],
    records: list[Record],
    run: tuple[Path, RunFacts] | None,
    others: Mapping[str, Path],
) -> tuple[list[Check], list[str]]:
    """The checks verify runs beyond our own for this tree's package: worker paths, the skill's rules."""
    checks = worker_path_checks(tree, records, run)
    rule = SKILL_RULES.get(tree.package)
    if rule is None:
        return checks, []
    more, lines = rule(tree, patches, others)
    return checks + more, lines
