"""Issue 42, item 9: `detect` on verl's own examples, run from a folder other than the checkout's root.

One test per case the issue found on the real scripts, each checked against bash + Hydra
(tests/script_oracle.py), none of our reader involved in the truth:

- the multi-turn examples name their config folder `$(pwd)/examples/...`, in a checkout whose `verl/`
  is not `--verl-root`'s package (a clone beside an installed release);
- `split_placement/run_deepseek7b_llm.sh` runs `python3 main_ppo_split.py`, the entry point beside it;
- the trtllm examples end their launch with `"${@:2}"`, which gives no word when no argument is left.

The sweeps over every script of both corpora are tests/real/test_script_corpus.py (exhaustive).
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest
from conftest import cli, cli_json
from script_oracle import SHARED, run_in_checkout, verl_root

from rlprobe_patch.base.errors import ExitCode

V061 = SHARED / "upstream/verl-examples/v0.6.1/examples"
needs_corpus = pytest.mark.skipif(not V061.is_dir(), reason="../shared/upstream is not beside the repository")


def facts_of(out: dict, keys: dict) -> dict:
    return {key: out["facts"].get(key, {}).get("value") for key in keys}


def clone(tmp_path: Path, release_root: Path) -> Path:
    """A verl checkout as a user's clone is: `examples/` and a `verl/` of its own (not --verl-root's)."""
    repo = tmp_path / "verl"
    repo.mkdir()
    (repo / "examples").symlink_to(V061)
    shutil.copytree(release_root / "verl", repo / "verl")
    return repo


@needs_corpus
def test_a_config_folder_under_pwd_is_read_from_the_checkout_that_holds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`PROJECT_DIR="$(pwd)"; --config-path="$PROJECT_DIR/examples/sglang_multiturn/config"`, read from
    elsewhere: the checkout above the script holds that folder, so it is read as run from there and the
    notice names the folder assumed; a copy of the script outside any checkout is refused naming --cwd."""
    root = verl_root("0.6.1")
    rel = "sglang_multiturn/run_qwen2.5-3b_gsm8k_multiturn.sh"
    repo = clone(tmp_path, root)
    truth = run_in_checkout(repo, f"examples/{rel}", root).main
    assert truth is not None and not truth.error and truth.facts["rollout_backend"] == "sglang", truth
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, out = cli_json("detect", repo / "examples" / rel, "--verl-root", root)
    assert code == ExitCode.OK, out
    assert facts_of(out, truth.facts) == truth.facts
    assumed = [n for n in out["notices"] if n.startswith(f"read as run from {repo}:")]
    assert assumed and "examples/sglang_multiturn/config" in assumed[0] and "--cwd" in assumed[0], out["notices"]
    # told where it runs, nothing is assumed
    code, out = cli_json("detect", repo / "examples" / rel, "--verl-root", root, "--cwd", repo)
    assert code == ExitCode.OK and facts_of(out, truth.facts) == truth.facts, out
    assert not any(n.startswith("read as run from") for n in out["notices"]), out["notices"]
    # outside any checkout: no folder holds it, the refusal says to name the one it runs in
    alone = tmp_path / "alone" / "run.sh"
    alone.parent.mkdir()
    shutil.copy(V061 / rel, alone)
    code, out = cli_json("detect", alone, "--verl-root", root)
    assert code == ExitCode.REFUSED and not out["ok"], out
    assert "--cwd DIR" in out["hint"] and "examples/sglang_multiturn/config" in out["hint"], out
    printed = cli("detect", alone, "--verl-root", root).output
    assert "--cwd DIR" in printed.splitlines()[-1], printed


@needs_corpus
@pytest.mark.parametrize("where", ["elsewhere", "checkout root"])
def test_an_entry_point_beside_the_script_is_found(where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`split_placement/run_deepseek7b_llm.sh` runs `python3 main_ppo_split.py`, its own entry point (config
    `config/ppo_trainer_split.yaml`, searching `file://../../verl/trainer/config`): run, as its README says,
    from its folder. Read from elsewhere or from the checkout's root, it is read as run from there."""
    root = verl_root("0.6.1")
    folder = "examples/split_placement"
    repo = tmp_path / "verl"
    shutil.copytree(V061 / "split_placement", repo / folder)  # a copy: `../..` from a linked folder leaves it
    (repo / "verl").symlink_to(root / "verl")
    truth = run_in_checkout(repo, f"{folder}/run_deepseek7b_llm.sh", root, workdir=folder).main
    assert truth is not None and not truth.error and truth.ppo, truth
    assert truth.entry == "main_ppo_split.py" and truth.facts["rollout_backend"] == "vllm"
    here = tmp_path / "elsewhere" if where == "elsewhere" else repo
    here.mkdir(exist_ok=True)
    monkeypatch.chdir(here)
    script = repo / folder / "run_deepseek7b_llm.sh" if where == "elsewhere" else Path(folder, "run_deepseek7b_llm.sh")
    code, out = cli_json("detect", script, "--verl-root", root)
    assert code == ExitCode.OK, out
    assert out["launch"]["entry"] == "main_ppo_split.py"
    assert facts_of(out, truth.facts) == truth.facts
    assumed = [n for n in out["notices"] if n.startswith(f"read as run from {repo / folder}:")]
    assert assumed and "main_ppo_split.py" in assumed[0], out["notices"]


# The shape of verl's trtllm examples (`grpo_trainer/run_qwen2-7b_math_trtllm.sh` and its two siblings):
# the first argument is the TP, the rest go to Hydra; run with none, "${@:2}" gives no word.
TRTLLM = """\
    TP=${1:-4}
    python3 -m verl.trainer.main_ppo \\
        algorithm.adv_estimator=grpo \\
        actor_rollout_ref.rollout.tensor_model_parallel_size=${TP} \\
        actor_rollout_ref.rollout.name=trtllm \\
        +actor_rollout_ref.rollout.engine_kwargs.trtllm.batch_wait_timeout_iters=32 \\
        trainer.n_gpus_per_node=8 \\
        "${@:2}"
"""


def test_no_arguments_left_for_a_slice_give_no_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """bash gives `"${@:2}"` no word when the script has one argument or none; Hydra composes the launch."""
    root = verl_root("0.8.0")
    repo = tmp_path / "verl"
    (repo / "examples").mkdir(parents=True)
    (repo / "verl").symlink_to(root / "verl")
    (repo / "examples" / "run_trtllm.sh").write_text(textwrap.dedent(TRTLLM))
    truth = run_in_checkout(repo, "examples/run_trtllm.sh", root).main
    assert truth is not None and not truth.error, truth
    assert truth.args[-1] == "trainer.n_gpus_per_node=8", truth.args  # no empty word after it
    monkeypatch.chdir(repo)
    code, out = cli_json("detect", "examples/run_trtllm.sh", "--verl-root", root)
    assert code == ExitCode.OK and not out["compose_errors"], out
    assert [a["text"] for a in out["launch"]["argv"]] == truth.args
    assert facts_of(out, truth.facts) == truth.facts and out["rollout_backend"] == "trtllm"
    code, out = cli_json("detect", "examples/run_trtllm.sh", "--verl-root", root, "--arg", "2")
    assert code == ExitCode.OK and out["facts"]["rollout_tp"]["value"] == 2, out
    assert out["launch"]["argv"][-1]["text"] == "trainer.n_gpus_per_node=8", out["launch"]
