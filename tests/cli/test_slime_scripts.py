"""detect / script / check-script on slime's own launch scripts (issue 18, item 4).

Real material: the `scripts/` folders of the four slime release archives in
`../shared/upstream/slime/`, unpacked into a temporary folder. The oracle is bash itself: each
script runs with its launchers (`python3`, `ray`, `pkill`, `nvidia-smi`, `sleep`, `ssh`, ...)
replaced on PATH by recorders that write their argv and exit, with only a few harmless real
tools (`dirname`, `grep`, `wc`, ...) reachable, in an empty environment. What bash hands to
`train.py` is compared with what our reader reads.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from script_oracle import SHARED

from rlprobe_patch.base.errors import PatchError
from rlprobe_patch.cli import main
from rlprobe_patch.launch.script import ReaderOptions, read_script
from rlprobe_patch.workflow.config import build_config

UPSTREAM = SHARED / "upstream" / "slime"
RELEASES = ("0.2.2", "0.2.4", "0.3.0", "0.3.1")
RECORDED = ("python", "python3", "ray", "pkill", "killall", "sleep", "nvidia-smi", "ssh", "rm", "pip", "git", "kill")
REAL_TOOLS = (
    "dirname",
    "basename",
    "grep",
    "wc",
    "tr",
    "cat",
    "head",
    "tail",
    "sed",
    "awk",
    "cut",
    "mkdir",
    "date",
    "seq",
)
# Scripts bash stops before their launch unless these are set (they `exit 1` on an empty one).
SCRIPT_ENV = {"BASE_FOLDER": "/base", "BASE_DIR": "/base", "MASTER_ADDR": "10.0.0.1"}

# Scripts that stop unless the machine has something (bash runs the check; a static reader cannot).
MACHINE_CHECKS = {"run-qwen3-4B-amd.sh": "exits 1 unless `pip list` shows megatron-core"}

pytestmark = pytest.mark.skipif(not UPSTREAM.is_dir(), reason="../shared/upstream/slime not here")


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for release in RELEASES:
        folder = tmp_path_factory.mktemp(f"slime-{release}")
        with tarfile.open(UPSTREAM / f"slime-v{release}.tar.gz") as tar:
            tar.extractall(folder, filter="data")
        (root,) = folder.iterdir()
        out[release] = root
    return out


def launch_scripts(root: Path) -> list[Path]:
    """slime's launch scripts: those of scripts/ (not the sourced model files) that name its entry points."""
    return sorted(
        p
        for p in (root / "scripts").rglob("*.sh")
        if "models" not in p.parts and any(e in p.read_text() for e in ("train.py", "train_async.py"))
    )


def bash_oracle(script: Path, tmp: Path, env: dict[str, str] | None = None) -> list[dict[str, object]]:
    """Run `script` under bash with recorders: every recorded call (name, argv, DUMP_ON seen)."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    record = tmp / "record.jsonl"
    record.unlink(missing_ok=True)
    recorder = (  # bash only: one record per call, fields NUL-separated
        "#!/bin/bash\n"
        '{ printf \'%s\\0\' "${0##*/}" "${DUMP_ON-}" "${DUMP_PHASE-}" "$@"; printf \'\\036\'; }'
        ' >> "$ORACLE_RECORD"\n'
        "exit 0\n"
    )
    for name in RECORDED:
        (bin_dir / name).write_text(recorder)
        (bin_dir / name).chmod(0o755)
    (bin_dir / "mktemp").write_text('#!/bin/bash\necho "$HOME/mktemp.out"\n')  # a file in the temporary HOME
    (bin_dir / "mktemp").chmod(0o755)
    for name in REAL_TOOLS:
        real = shutil.which(name)
        if real and not (bin_dir / name).exists():
            (bin_dir / name).symlink_to(real)
    home = tmp / "home"
    home.mkdir(exist_ok=True)
    environ = {
        "PATH": str(bin_dir),
        "HOME": str(home),
        "ORACLE_RECORD": str(record),
        **(env or {}),
    }
    subprocess.run(["/bin/bash", str(script)], cwd=home, env=environ, capture_output=True, timeout=30, check=False)
    if not record.exists():
        return []
    calls = []
    for item in record.read_bytes().split(b"\x1e")[:-1]:
        name, dump_on, dump_phase, *argv = item.decode().split("\0")[:-1]
        calls.append({"name": name, "argv": argv, "DUMP_ON": dump_on or None, "DUMP_PHASE": dump_phase or None})
    return calls


def bash_train_argv(calls: list[dict[str, object]]) -> list[str] | None:
    """The argv bash gives slime's train.py / train_async.py (after `ray job submit ... --` or python3)."""
    for call in calls:
        argv = [str(a) for a in call["argv"]]  # type: ignore[union-attr]
        if call["name"] == "ray" and argv[:2] == ["job", "submit"] and "--" in argv:
            at = argv.index("--")  # `-- python3 train.py ...`
            entry, argv = argv[at + 2], argv[at + 3 :]
        elif str(call["name"]).startswith("python") and argv and argv[0].endswith(("train.py", "train_async.py")):
            entry, argv = argv[0], argv[1:]
        else:
            continue
        if Path(entry).name in ("train.py", "train_async.py"):
            return argv
    return None


def test_every_launch_script_of_the_four_releases_is_read(trees: dict[str, Path]) -> None:
    """How many of slime's own launch scripts the reader reads, and why the others are refused."""
    read: dict[str, int] = {}
    refused: dict[str, list[str]] = {}
    for release, root in trees.items():
        scripts = launch_scripts(root)
        assert len(scripts) >= 15, (release, len(scripts))
        read[release] = 0
        for script in scripts:
            try:
                s = read_script(script, ReaderOptions(env=SCRIPT_ENV))
            except PatchError as exc:
                refused.setdefault(release, []).append(f"{script.name}: {exc.message}")
                continue
            assert s.framework == "slime" and s.launch is not None
            read[release] += 1
    # Refused: only scripts that source a models file that is not where they say (bash fails there too):
    # scripts/low_precision/* source ../scripts/models/, the reproducibility script scripts/models/ from scripts/.
    for items in refused.values():
        assert all("sources" in item and "which does not exist" in item for item in items), items
        assert len(items) == 3, items
    assert read == {"0.2.2": 20, "0.2.4": 24, "0.3.0": 26, "0.3.1": 26}, read


def test_facts_of_real_scripts(trees: dict[str, Path]) -> None:
    s = read_script(trees["0.3.1"] / "scripts" / "run-qwen3-4B.sh")
    assert s.launch is not None and s.launch.launcher == ("ray job submit", "python3")
    assert s.fact("entry") == "train.py"
    facts = {k: (v.value, v.source) for k, v in s.facts.items()}
    assert facts["actor_tp"] == ("2", "run-qwen3-4B.sh:75")
    assert facts["actor_pp"] == ("1", "run-qwen3-4B.sh:77")
    assert facts["actor_cp"] == ("1", "run-qwen3-4B.sh:78")
    assert facts["rollout_tp"] == ("2", "run-qwen3-4B.sh:118")
    assert facts["dynamic_batch"] == (True, "run-qwen3-4B.sh:87")
    assert facts["colocate"] == (True, "run-qwen3-4B.sh:151")
    assert facts["micro_batch_size"] == (1, "slime default (not set)")  # `# --micro-batch-size 1` is a comment
    assert facts["rollout_batch_size"][0] == "32" and facts["n_samples_per_prompt"][0] == "8"
    # NUM_GPUS comes from nvidia-smi: known only at run time
    assert "value not known before the run" in s.settings["actor-num-gpus-per-node"].source
    # the model file it sources (scripts/models/qwen3-4B.sh)
    assert s.settings["num-layers"].value == "36" and s.settings["num-layers"].source == "qwen3-4B.sh:3"
    # train_async.py, the v0.2.2 FSDP script
    fully_async = read_script(trees["0.2.2"] / "scripts" / "run-qwen3-4B-fsdp.sh")
    assert fully_async.fact("train_backend") == "fsdp"
    asyncs = [p for p in launch_scripts(trees["0.3.1"]) if "train_async.py" in p.read_text()]
    assert asyncs
    assert read_script(asyncs[0], ReaderOptions(env=SCRIPT_ENV)).fact("entry") == "train_async.py"


def test_reader_reads_what_bash_runs(trees: dict[str, Path], tmp_path: Path) -> None:
    """The oracle: bash's argv to train.py equals the reader's, word for word, where the reader knows each word."""
    compared = partial = 0
    for script in launch_scripts(trees["0.3.1"]):
        calls = bash_oracle(script, tmp_path, SCRIPT_ENV)
        truth = bash_train_argv(calls)
        try:
            s = read_script(script, ReaderOptions(env=SCRIPT_ENV))
        except PatchError:
            assert truth is None, script.name  # bash stops too (a sourced file is missing, under set -e)
            continue
        if script.name in MACHINE_CHECKS:
            assert truth is None, script.name  # bash stops there on this machine; our reader cannot know
            continue
        assert truth is not None, script.name
        assert s.launch is not None
        ours = [f.text if f.exact else None for f in s.launch.args]
        if None in ours and len(ours) != len(truth):  # `$(seq 16 8 256)`: one word unknown to us, many to bash
            first, last = ours.index(None), len(ours) - ours[::-1].index(None)
            assert ours[:first] == truth[:first], script.name
            assert ours[last:] == truth[len(truth) - (len(ours) - last) :], script.name
            partial += 1
        else:
            assert len(ours) == len(truth), (script.name, len(ours), len(truth))
            assert all(o is None or o == t for o, t in zip(ours, truth, strict=True)), script.name
        compared += 1
    assert (compared, partial) == (25, 8)  # 8 with a word only a run knows ($(seq ...), $(nproc) ...)
    # a real upstream slip both see: run-kimi-k2-Instruct.sh misses a `\` after --update-weight-buffer-size,
    # so MODEL_ARGS and the arrays after it never reach train.py
    kimi = read_script(trees["0.3.1"] / "scripts" / "run-kimi-k2-Instruct.sh")
    assert "num-layers" not in kimi.settings and kimi.settings["update-weight-buffer-size"].value == "2147483648"


def _configs(folder: Path) -> tuple[Path, Path]:
    actor, generate = folder / "actor.json", folder / "generate.json"
    actor.write_text(json.dumps(build_config("consistency", "actor", str(folder / "dump_actor"))))
    generate.write_text(json.dumps(build_config("consistency", "generate", str(folder / "dump_generate"))))
    return actor, generate


def test_script_and_check_script_on_a_real_slime_script(trees: dict[str, Path], tmp_path: Path) -> None:
    scripts = trees["0.3.1"] / "scripts"
    original = scripts / "run-qwen3-4B.sh"
    before = original.read_bytes()
    actor, generate = _configs(scripts)
    runner = CliRunner()
    # the original: what is wrong, with file:line
    result = runner.invoke(main, ["check-script", str(original), "--mode", "consistency", "--json"])
    assert result.exit_code == 4, result.output
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert checks["--use-dynamic-batch-size off"]["detail"].startswith("is on at run-qwen3-4B.sh:87")
    assert checks["--balance-data off"]["detail"].startswith("is on at run-qwen3-4B.sh:63")
    assert checks["--eval-interval off"]["detail"].startswith("is 20 at run-qwen3-4B.sh:67")
    assert not checks["--sglang-disable-radix-cache"]["ok"] and not checks["export DUMP_ON=1"]["ok"]
    assert checks["--pipeline-model-parallel-size 1"]["ok"]

    derived = scripts / "run-dump.sh"
    args = ["--mode", "consistency", "--actor-config", str(actor), "--generate-config", str(generate)]
    result = runner.invoke(main, ["script", str(original), *args, "--n-gpus", "4", "-o", str(derived), "--json"])
    assert result.exit_code == 0, result.output
    assert original.read_bytes() == before
    changes = {c["key"]: c["action"] for c in json.loads(result.stdout)["changes"]}
    assert changes["use-dynamic-batch-size"] == "removed" and changes["micro-batch-size"] == "added"
    result = runner.invoke(main, ["check-script", str(derived), "--mode", "consistency", "--json"])
    assert result.exit_code == 0, result.output
    detected = json.loads(runner.invoke(main, ["detect", str(derived), "--no-trees", "--json"]).output)
    assert detected["mode"] == "consistency" and detected["scores"]["consistency"] == 18  # DUMP_ON, words, dump cfg
    # what bash really runs: the flags reach train.py, the switches reach `ray start` (Ray's workers)
    calls = bash_oracle(derived, tmp_path)
    argv = bash_train_argv(calls)
    assert argv is not None
    assert "--use-dynamic-batch-size" not in argv and "--balance-data" not in argv and "--eval-interval" not in argv
    for flag, value in (("--micro-batch-size", "1"), ("--n-samples-per-prompt", "2"), ("--global-batch-size", "2")):
        assert argv[len(argv) - 1 - argv[::-1].index(flag) + 1] == value  # argparse keeps the last
    assert "--sglang-disable-radix-cache" in argv and "--sglang-disable-cuda-graph" in argv
    assert argv[argv.index("--sglang-msprobe-dump-config") + 1] == str(generate)
    ray_start = next(c for c in calls if c["name"] == "ray" and c["argv"][0] == "start")  # type: ignore[index]
    assert ray_start["DUMP_ON"] == "1" and ray_start["DUMP_PHASE"] == "log_prob"


def test_check_script_reads_dump_phase_with_slimes_grammar(tmp_path: Path) -> None:
    """Stand-in script (ours): slime's DUMP_PHASE list is checked by slime's switch reader."""
    script = tmp_path / "run.sh"
    runner = CliRunner()

    def phase_check(phase: str) -> dict[str, object]:
        script.write_text(f"export DUMP_ON=1\nexport DUMP_PHASE={phase}\npython3 train.py --micro-batch-size 1\n")
        result = runner.invoke(main, ["check-script", str(script), "--mode", "consistency", "--json"])
        checks = json.loads(result.stdout)["checks"]
        return next((c for c in checks if c["name"] == "DUMP_PHASE value"), {})

    assert phase_check("log_prob,ref_forward") == {}  # a valid list: no complaint
    bad = phase_check("log_prob,reff")
    assert not bad["ok"] and "run.sh:2" in str(bad["detail"]) and "reff is not a pass of slime" in str(bad["detail"])


def test_removing_a_switch_set_in_a_sourced_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "perf.sh").write_text("PERF=(--use-dynamic-batch-size)\n")
    script = tmp_path / "run.sh"
    script.write_text('source "$(dirname "$0")/perf.sh"\npython3 train.py "${PERF[@]}"\n')
    actor, generate = _configs(tmp_path)
    args = ["--actor-config", str(actor), "--generate-config", str(generate)]
    result = CliRunner().invoke(main, ["script", str(script), "--mode", "consistency", *args, "--dry-run", "--json"])
    assert result.exit_code == 3, result.output
    assert "perf.sh:1" in json.loads(result.stdout)["message"]


def test_training_mode_is_refused_for_slime(tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text("python3 train.py --tensor-model-parallel-size 2\n")
    result = CliRunner().invoke(main, ["check-script", str(script), "--mode", "training", "--json"])
    checks = json.loads(result.stdout)["checks"]
    assert any(c["name"] == "alignment" and "no msprobe integration" in c["detail"] for c in checks)
    assert os.path.exists(script)


def test_tp_mismatch_is_refused_with_the_fix_and_the_fix_works(tmp_path: Path) -> None:
    """Stand-in script (ours): actor TP 2, SGLang engines of 4 GPUs."""
    script = tmp_path / "run.sh"
    script.write_text(
        "PERF=(--tensor-model-parallel-size 2)\npython3 train.py ${PERF[@]} --rollout-num-gpus-per-engine 4\n"
    )
    actor, generate = _configs(tmp_path)
    args = ["script", str(script), "--mode", "consistency", "--actor-config", str(actor), "--generate-config"]
    runner = CliRunner()
    result = runner.invoke(main, [*args, str(generate), "--n-gpus", "2", "--dry-run", "--json"])
    assert result.exit_code == 3, result.output
    error = json.loads(result.stdout)
    assert "--tensor-model-parallel-size 2 (run.sh:1)" in error["details"][0]
    assert "--rollout-num-gpus-per-engine 4 (run.sh:2)" in error["details"][0]
    assert "--set rollout-num-gpus-per-engine=2" in error["hint"]
    fixed = [*args, str(generate), "--n-gpus", "2", "--set", "rollout-num-gpus-per-engine=2", "--dry-run", "--json"]
    result = runner.invoke(main, fixed)
    assert result.exit_code == 0, result.output
    text = json.loads(result.stdout)["text"]
    assert "--rollout-num-gpus-per-engine=2 \\\n" in text and "--n-samples-per-prompt 1" in text


def test_old_sglang_gets_the_model_runner_patch_config(tmp_path: Path) -> None:
    """Stand-in script (ours): slime 0.2.x ships SGLang 0.5.5-0.5.9, without msprobe's option."""
    script = tmp_path / "run.sh"
    script.write_text("python3 train.py --tensor-model-parallel-size 1\n")
    actor, generate = _configs(tmp_path)
    args = ["--actor-config", str(actor), "--generate-config", str(generate), "--sglang-version", "0.5.9"]
    result = CliRunner().invoke(main, ["script", str(script), "--mode", "consistency", *args, "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["env"]["MSPROBE_SGLANG_CONFIG"] == str(generate)
    assert "--sglang-msprobe-dump-config" not in data["text"]
    assert any("sglang.model-runner" in n for n in data["notices"])
    detected = CliRunner().invoke(main, ["detect", str(script), "--no-trees", "--json"])
    facts = json.loads(detected.output)
    assert facts["framework"] == "slime" and facts["facts"]["actor_tp"]["value"] == "1"


def test_a_switch_written_flag_equals_value_is_removed_whole(tmp_path: Path) -> None:
    """Stand-in script (ours): `--eval-interval=5` and a switch in an array, removed at their words."""
    script = tmp_path / "run.sh"
    script.write_text("A=(--balance-data --lr 1)\npython3 train.py --eval-interval=5 \\\n  ${A[@]}\n")
    actor, generate = _configs(tmp_path)
    args = ["--actor-config", str(actor), "--generate-config", str(generate), "--n-gpus", "1"]
    result = CliRunner().invoke(main, ["script", str(script), "--mode", "consistency", *args, "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    text = json.loads(result.stdout)["text"]
    assert "A=( --lr 1)" in text and "python3 train.py  \\\n" in text and "eval-interval" not in text
