"""The launch-script reader (workflow/shell.py, launch.py) against bash itself, and its refusals.

Each snippet is run by bash with `python3` replaced on PATH by a recorder (its argv written to a
file, nothing run); the reader, which never runs anything, must produce the same argv.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from conftest import CONFIGS, cli
from script_oracle import SHARED

from rlprobe_patch.base.errors import ExitCode, RefusedError
from rlprobe_patch.launch.commands import launches
from rlprobe_patch.launch.shell import read_shell

# `python3 -c 'import X'` probes fail, as where the module is not installed (neither is it here).
RECORDER = '#!/bin/bash\n[ "$1" = -c ] && exit 1\nprintf \'%s\\0\' "$@" > "$RECORD"\n'

SNIPPETS = {
    "parameter slices (issue 29)": """
        set -- first trainer.nnodes=2 "trainer.project_name=a b" x.y=3
        V=abcdefgh
        A=(a.b=1 c.d=2 e.f=3 g.h=4)
        python3 -m verl.trainer.main_ppo "${@:2}" s1=${V:2} s2=${V:1:3} s3=${V: -3} s4=${V:1:-2} \\
            "${A[@]:1:2}" "${A[@]: -1}" p.q=${@:3:1}
    """,
    "slices with no argument left (issue 42, verl's trtllm examples)": """
        TP=${1:-4}
        A=(a.b=1)
        python3 -m verl.trainer.main_ppo tp=$TP "${@:2}" "${A[@]:1}" "${@}" "${A[@]:5:1}" "${@:1}" "${@:-d=1}"
    """,
    "slices past the arguments given (issue 42)": """
        set -- only
        python3 -m verl.trainer.main_ppo "${@:2}" "x=${@:2}" "${@:3}"'' "${*:2}" "${@:1}"
    """,
    "arrays and defaults": """
        BACKEND=${BACKEND:-vllm}
        TP=${TP:=2}
        A=( a.x=1 "b.y=$BACKEND" 'c.z=${NOT_EXPANDED}' )
        A+=(d.w=$TP)
        python3 -m verl.trainer.main_ppo "${A[@]}" e.v=${MISSING-dflt} f.u=${BACKEND:+set}
    """,
    "launcher in an array, uv run, arguments": """
        LAUNCH=(uv run --with foo python3 -m verl.trainer.main_ppo)
        set -- trainer.nnodes=2 "trainer.project_name=a b"
        "${LAUNCH[@]}" x=1 "$@"
    """,
    "functions, locals, shift": """
        run() {
            local engine=$1
            shift
            python3 -m verl.trainer.main_ppo model_engine=$engine "$@"
        }
        run megatron trainer.nnodes=1 trainer.n_gpus_per_node=$((2 * 4))
    """,
    "if and case that resolve": """
        INFER=${INFER:-sglang}
        if [ "$INFER" = vllm ]; then TP=4; elif [[ $INFER == sg* ]]; then TP=2; else TP=1; fi
        case "$INFER" in
            vllm|trtllm) NAME=a ;;
            *) NAME=b ;;
        esac
        python3 -m verl.trainer.main_ppo rollout.tp=$TP name=$NAME
    """,
    "dirname, pwd, cd, string operations": """
        HERE=$(cd "$(dirname "$0")" && pwd)
        P=/a/b/c.yaml
        python3 -m verl.trainer.main_ppo --config-path=$HERE/config x=${P##*/} y=${P%/*} z=${P/b/B} w=${HERE,,}
    """,
    "word splitting of a string of overrides, continued lines": """
        EXTRA="a=1 \\
            b=2"
        python3 -m verl.trainer.main_ppo $EXTRA "c=3 4" \\
            d=5
    """,
    "sourced file and a loop": """
        printf 'FROM_SOURCE=ok\\n' > "$(dirname "$0")/common.sh"
        source "$(dirname "$0")/common.sh"
        ARGS=()
        for role in actor ref; do ARGS+=("$role.tp=2"); done
        python3 -m verl.trainer.main_ppo s=$FROM_SOURCE "${ARGS[@]}"
    """,
    "an import probe": """
        DEVICE=${DEVICE:-$(python3 -c 'import no_such_module_here' 2>/dev/null && echo npu || echo gpu)}
        python3 -m verl.trainer.main_ppo trainer.device=$DEVICE
    """,
}


def bash_argv(script: Path, tmp_path: Path) -> list[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "python3").write_text(RECORDER)
    (bin_dir / "python3").chmod(0o755)
    (bin_dir / "uv").write_text('#!/bin/bash\nshift; while [[ $1 == -* ]]; do shift 2; done; exec "$@"\n')
    (bin_dir / "uv").chmod(0o755)
    record = tmp_path / "record"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "RECORD": str(record), "HOME": str(tmp_path)}
    subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, check=True, capture_output=True)
    return record.read_bytes().decode().split("\0")[:-1]


@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_the_reader_sees_what_bash_runs(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "run.sh"
    script.write_text(textwrap.dedent(SNIPPETS[name]))
    truth = bash_argv(script, tmp_path)
    (tmp_path / "common.sh").unlink(missing_ok=True)
    if "source" in SNIPPETS[name]:  # the reader reads the file the script would have written
        (tmp_path / "common.sh").write_text("FROM_SOURCE=ok\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    reading = read_shell(script)
    found = [launch for launch in launches(reading) if launch.is_verl]
    assert len(found) == 1, reading.runs
    launch = found[0]
    ours = ["-m", launch.entry, *(f.text for f in launch.args)] if launch.module else [launch.entry]
    assert ours == truth[truth.index("-m") :]
    assert all(f.exact for f in launch.args), [f.unresolved for f in launch.args]


def test_sources_name_the_line_each_value_was_written_on(tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text('E=megatron\nA=(\n  x=1\n  model_engine=$E\n)\npython3 -m verl.trainer.main_ppo "${A[@]}"\n')
    launch = launches(read_shell(script))[0]
    assert [(f.text, f.source) for f in launch.args] == [("x=1", "run.sh:3"), ("model_engine=megatron", "run.sh:4")]
    assert launch.args[1].via[0] == "E (run.sh:1)"


def test_what_only_a_run_knows_is_reported_not_guessed(tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text(
        "NAME=run-$(date +%Y%m%d)\n"
        'if [ -n "$SLURM_JOB_ID" ]; then NODES=4; fi\n'
        "while true; do break; done\n"
        "cat <<EOF > extra.yaml\na: 1\nEOF\n"
        "python3 -m verl.trainer.main_ppo trainer.experiment_name=$NAME trainer.nnodes=${NODES:-1}\n"
    )
    reading = read_shell(script)
    notes = [str(u) for u in reading.unresolved]
    assert any("run.sh:4" in n and "here-document" in n for n in notes), notes
    assert any("run.sh:3" in n and "loop" in n for n in notes), notes
    args = launches(reading)[0].args
    assert not args[0].exact and "date" in args[0].unresolved[0]
    assert args[1].text == "trainer.nnodes=1"  # SLURM_JOB_ID is unset: the condition resolves
    reading = read_shell(script, env={"SLURM_JOB_ID": "7"})
    assert launches(reading)[0].args[1].text == "trainer.nnodes=4"


def test_an_unknown_condition_reads_every_branch(tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text(
        "if nvidia-smi >/dev/null; then TP=8; else TP=4; fi\npython3 -m verl.trainer.main_ppo rollout.tp=$TP\n"
    )
    reading = read_shell(script)
    arg = launches(reading)[0].args[0]
    assert not arg.exact and "8 | 4" in arg.unresolved[0]
    assert any("every branch read" in str(u) for u in reading.unresolved)


BAD_SCRIPTS = {
    "syntax error": (b"python3 -m verl.trainer.main_ppo a=1\nif then fi (\n", "line 2: syntax error"),
    "binary": (b"\x7fELF\x00\x01\x02", "binary"),
    "not UTF-8": (b"python3 -m verl.trainer.main_ppo name=\xff\xfe\n", "not UTF-8"),
    "10 MB of text": (b"# filler\n" * (10 * 1024 * 1024 // 9), "not a launch script"),
    "no verl launch": (b"echo hello\ntorchrun train.py --lr 1\n", "no verl launch"),
    "a missing sourced file": (b"source ./nope.sh\npython3 -m verl.trainer.main_ppo a=1\n", "does not exist"),
    "a source loop": (b"source ./run.sh\npython3 -m verl.trainer.main_ppo a=1\n", "loop"),
}


@pytest.mark.parametrize("name", sorted(BAD_SCRIPTS))
@pytest.mark.parametrize("command", ["detect", "script", "check-script"])
def test_bad_scripts_are_refused_clearly(name: str, command: str, tmp_path: Path, monkeypatch) -> None:
    data, words = BAD_SCRIPTS[name]
    script = tmp_path / "run.sh"
    script.write_bytes(data)
    monkeypatch.chdir(tmp_path)
    before = sorted(os.listdir(tmp_path))
    args = [command, str(script), "--json"]
    if command != "detect":
        args += ["--mode", "consistency", *CONFIGS]
    result = cli(*args)
    assert result.exit_code == ExitCode.REFUSED, result.output
    out = json.loads(result.stdout)
    assert words in out["message"] + " ".join(out.get("details", [])), out
    assert "Traceback" not in result.output
    assert sorted(os.listdir(tmp_path)) == before  # nothing written


def test_a_syntax_error_names_its_line(tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text("A=1\nB=(\npython3 -m verl.trainer.main_ppo x=1\nif then\n")
    with pytest.raises(RefusedError) as caught:
        read_shell(script)
    assert f"{script}:" in caught.value.message and "syntax error" in caught.value.message


def test_valid_bash_the_grammar_does_not_know_is_read_around(tmp_path: Path) -> None:
    """tree-sitter-bash misreads `$(((a + b) * 2))`; bash -n accepts it: the rest is still read."""
    script = tmp_path / "run.sh"
    script.write_text("N=3\nL=${L:-$(((N + 2) * 2))}\npython3 -m verl.trainer.main_ppo a=1\n")
    reading = read_shell(script)
    assert launches(reading)[0].args[0].text == "a=1"
    assert any("not understood" in str(u) for u in reading.unresolved)


def test_the_largest_example_parses_quickly() -> None:
    """Parse and evaluation of the largest of verl's own example scripts (the bench measures it too)."""
    examples = SHARED / "upstream" / "verl-examples"
    if not examples.is_dir():
        pytest.skip("../shared/upstream is not beside the repository")
    largest = max(examples.rglob("*.sh"), key=lambda p: p.stat().st_size)
    read_shell(largest, cwd=largest.parent)  # warm: the grammar is loaded once per process
    start = time.perf_counter()
    reading = read_shell(largest, cwd=largest.parent)
    elapsed = time.perf_counter() - start
    assert reading.runs
    assert elapsed < 1.0  # a sanity bound only; the figure (< 20 ms) is the benchmark's
