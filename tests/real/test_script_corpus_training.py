"""Acceptance (issue 29, item 4): `script --mode training` on every PPO/GRPO example of both corpora.

The stages and each role's `profiler.enable` must match what the run has, checked against Hydra's
composed config: which roles the run has is decided by verl's own `need_reference_policy` and
`need_critic` (their source, read from the release's `verl/trainer/ppo/utils.py` and run on the
composed config), which stages verl accepts by `_STAGE_TO_ROLE` of its
`precision_debugger_profile.py`, and which of them dump by the worker methods annotated with them
(`DistProfiler.annotate(role=...)`). Each derived script is run by bash with recording launchers
and its launch composed by Hydra with the release's config.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import msprobe_configs
from omegaconf import OmegaConf
from script_oracle import (
    CORPORA,
    EXAMPLES,
    compose_config,
    corpus_truth,
    launched_env,
    main_config,
    printed_not_launched,
    run_in_checkout,
    run_recording_env,
    verl_root,
)

from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.cli import main

# The exhaustive leg's (`-m exhaustive`, .ci/run): too long for the README's test command (issue 35).
pytestmark = [pytest.mark.exhaustive, pytest.mark.skipif(not EXAMPLES.is_dir(), reason="no ../shared/upstream")]

SECTIONS = {"actor": "actor_rollout_ref.actor", "ref": "actor_rollout_ref.ref", "critic": "critic"}
STAGES_KEY = "global_profiler.global_tool_config.precision_debugger.stages"
# A config that exists: check-script fails on a missing one (issue 35, item 4).
TRAINING_CONFIG = msprobe_configs(Path(tempfile.mkdtemp(prefix="rlprobe-corpus-configs-")), "training")[5]


def run(*args: str) -> tuple[int, dict[str, Any]]:
    result = CliRunner().invoke(main, [*args, "--json"], catch_exceptions=False)
    return result.exit_code, json.loads(result.stdout)


class VerlRules:
    """What the release's own source says: its stages and roles, and which roles a config has."""

    def __init__(self, root: Path) -> None:
        profile = (root / "verl/utils/profiler/precision_debugger_profile.py").read_text()
        tree = ast.parse(profile)
        table = next(
            node.value
            for node in tree.body
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "_STAGE_TO_ROLE"
        )
        self.stage_role: dict[str, str] = ast.literal_eval(table)
        annotated = set()
        for path in (root / "verl/workers").rglob("*.py"):
            annotated |= set(re.findall(r"annotate\([^)]*role=\"(\w+)\"", path.read_text()))
        self.dumping = {stage for stage in self.stage_role if stage in annotated}
        utils = ast.parse((root / "verl/trainer/ppo/utils.py").read_text())
        wanted = [
            node
            for node in utils.body
            if isinstance(node, ast.FunctionDef) and node.name in ("need_reference_policy", "need_critic")
        ]
        namespace: dict[str, Any] = {
            "DictConfig": object,
            "warnings": warnings,
            "AdvantageEstimator": type("AdvantageEstimator", (), {"GAE": "gae"}),
        }
        exec(compile(ast.Module(body=wanted, type_ignores=[]), "verl/trainer/ppo/utils.py", "exec"), namespace)
        self.need_ref, self.need_critic = namespace["need_reference_policy"], namespace["need_critic"]

    def roles(self, config: Any) -> set[str]:
        roles = {"actor"}
        if self.need_ref(config):
            roles.add("ref")
        with warnings.catch_warnings():  # need_critic warns where the estimator needs none
            warnings.simplefilter("ignore")
            if self.need_critic(config):
                roles.add("critic")
        return roles


def select(config: Any, key: str) -> Any:
    value = OmegaConf.select(config, key, default=None)
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def ppo_examples(corpus: str) -> list[Any]:
    return [t for t in corpus_truth(corpus) if t.composes and t.main is not None and "ppo" in t.main.entry]


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    def make(corpus: str) -> Path:
        repo = tmp_path / "verl"
        shutil.copytree(EXAMPLES / corpus / "examples", repo / "examples", symlinks=True)
        (repo / "verl").symlink_to(verl_root(CORPORA[corpus]) / "verl")
        monkeypatch.chdir(repo)
        monkeypatch.setenv("HOME", str(tmp_path / "home"))
        return repo

    return make


def kind(config: Any, roles: set[str]) -> tuple[Any, ...]:
    """What `script --mode training` decides the stages and `profiler.enable` values from: the roles, the
    engine, and the profiler settings the script already has."""
    profiler = tuple(select(config, f"{section}.profiler.enable") for section in SECTIONS.values())
    return (
        tuple(sorted(roles)),
        select(config, "actor_rollout_ref.actor.strategy"),
        profiler,
        select(config, "global_profiler.tool"),
        json.dumps(select(config, STAGES_KEY)),
    )


def test_every_example_of_080_gets_the_stages_it_has(checkout: Any) -> None:
    """Every PPO/GRPO example is composed, derived, run by bash (the launchers recording the environment)
    and composed again: the stages and each role's `profiler.enable` are what the run has, the launch is
    what `script` printed, the switches it exported are in force (issue 29; all 71 take about 4 minutes
    of one core). The kinds of run (roles, engine, the profiler settings it has) are counted."""
    corpus = "v0.8.0"
    root = verl_root(CORPORA[corpus])
    repo = checkout(corpus)
    rules = VerlRules(root)
    cases = ppo_examples(corpus)
    assert len(cases) > 50, f"{corpus}: only {len(cases)} PPO/GRPO examples compose"
    problems: list[str] = []
    seen: dict[str, int] = {"ref": 0, "no ref": 0, "critic": 0}
    kinds: dict[tuple[Any, ...], list[tuple[Any, Any, set[str]]]] = {}
    for truth in sorted(cases, key=lambda t: hashlib.sha256(t.script.encode()).hexdigest()):
        assert truth.main is not None
        before = compose_config(truth.main.entry, truth.main.args, root, repo)
        roles = rules.roles(before)
        seen["ref" if "ref" in roles else "no ref"] += 1
        seen["critic"] += "critic" in roles
        kinds.setdefault(kind(before, roles), []).append((truth, before, roles))
    chosen = [case for members in kinds.values() for case in members]
    for truth, before, roles in chosen:
        original = f"examples/{truth.script}"
        output = original.removesuffix(".sh") + ".training.sh"
        code, out = run(
            "script", original, "--mode", "training", "--verl-root", str(root),
            "--training-config", TRAINING_CONFIG, "-o", output, "--force",
        )  # fmt: skip
        if code != ExitCode.OK:
            problems.append(f"{truth.script}: exit {code}: {out.get('message')} {out.get('details')}")
            continue
        configs: list[Any] = []  # each launch's composed config, from the run itself (no second compose)
        recorded = run_recording_env(repo, output, root, list(out["env"]), configs)
        derived = recorded.main
        if derived is None or derived.error:
            problems.append(f"{truth.script}: the derived script does not compose: {derived and derived.error}")
            continue
        if unlaunched := printed_not_launched(out["changes"], derived.args):  # issue 29: runs what was checked
            problems.append(f"{truth.script}: the derived launch is not what script printed: {unlaunched}")
            continue
        env = launched_env(recorded.calls)
        if unset := [
            f"${n}: exported {v!r}, at launch {env.get(n)!r}" for n, v in out["env"].items() if env.get(n) != v
        ]:
            problems.append(f"{truth.script}: {unset}")
            continue
        after = main_config(recorded, configs)
        expected = [s for s in rules.stage_role if s in rules.dumping and rules.stage_role[s] in roles]
        wrong = []
        if select(after, "global_profiler.tool") != "precision_debugger":
            wrong.append("global_profiler.tool")
        if sorted(select(after, STAGES_KEY) or []) != sorted(expected):  # verl keeps them as a set
            wrong.append(f"stages {select(after, STAGES_KEY)} != {expected} (roles {sorted(roles)})")
        for role, section in SECTIONS.items():
            wanted = (
                True
                if role in {rules.stage_role[s] for s in expected}
                else select(before, f"{section}.profiler.enable")
            )
            if select(after, f"{section}.profiler.enable") != wanted:
                wrong.append(
                    f"{section}.profiler.enable is {select(after, f'{section}.profiler.enable')}, not {wanted}"
                )
        if rules.roles(after) != roles:
            wrong.append("the derived run has other roles")
        if wrong:
            problems.append(f"{truth.script}: {wrong}")
    print(f"{corpus}: {len(cases)} PPO/GRPO examples, {len(kinds)} kinds, {len(chosen)} derived; {seen}")
    assert not problems, "\n".join(problems)
    assert seen["ref"] and seen["no ref"] and seen["critic"], seen  # both kinds of run were checked


def test_critic_stages_are_accepted_where_the_run_has_a_critic(checkout: Any) -> None:
    """v0.8.0 `ppo_trainer/run_qwen3_8b_fsdp.sh` has a critic (GAE) and no ref model."""
    corpus = "v0.8.0"
    root = verl_root(CORPORA[corpus])
    repo = checkout(corpus)
    rules = VerlRules(root)
    original, output = "examples/ppo_trainer/run_qwen3_8b_fsdp.sh", "examples/ppo_trainer/critic.sh"
    truth = next(t for t in ppo_examples(corpus) if t.script == "ppo_trainer/run_qwen3_8b_fsdp.sh")
    assert truth.main is not None
    assert rules.roles(compose_config(truth.main.entry, truth.main.args, root, repo)) == {"actor", "critic"}
    base = ("script", original, "--mode", "training", "--verl-root", str(root), "-o", output, "--force")
    base += ("--training-config", TRAINING_CONFIG)
    code, out = run(*base, "--stages", "compute_values,critic_update")
    assert code == ExitCode.OK, out
    notices = " ".join(out["notices"])
    for stage in ("compute_values", "critic_update"):
        assert stage in rules.stage_role and stage not in rules.dumping  # what the notice says is true
        assert f"stage {stage}: verl 0.8.0 accepts it, but none of its worker methods runs under it" in notices
    configs: list[Any] = []
    ran = run_in_checkout(repo, output, root, configs)
    derived = ran.main
    assert derived is not None and not derived.error
    after = main_config(ran, configs)
    assert select(after, STAGES_KEY) == ["compute_values", "critic_update"]
    assert select(after, "critic.profiler.enable") is True
    assert select(after, "actor_rollout_ref.ref.profiler.enable") is False
    code, checked = run("check-script", output, "--mode", "training", "--verl-root", str(root))
    assert code == ExitCode.OK, checked
    # a stage of a role the run does not have is refused, naming it
    code, out = run(*base, "--stages", "ref_compute_log_prob")
    assert code == ExitCode.REFUSED, out
    assert any("stage ref_compute_log_prob: this run has no ref" in d for d in out["details"]), out


def test_the_0_6_1_examples_are_refused_for_training(checkout: Any) -> None:
    """verl 0.6.1 has no precision_debugger profiler (the release data's cut-off, true of its tree)."""
    corpus = "v0.6.1"
    root = verl_root(CORPORA[corpus])
    repo = checkout(corpus)
    assert not (root / "verl/utils/profiler/precision_debugger_profile.py").exists()
    cases = ppo_examples(corpus)
    assert len(cases) > 50
    for truth in cases:
        code, out = run(
            "script", f"examples/{truth.script}", "--mode", "training", "--verl-root", str(root),
            "-o", str(repo / "out.sh"), "--force", "--training-config", TRAINING_CONFIG,
        )  # fmt: skip
        assert code == ExitCode.REFUSED, (truth.script, out)
        assert any("has no precision_debugger profiler" in d for d in out["details"]), (truth.script, out)
