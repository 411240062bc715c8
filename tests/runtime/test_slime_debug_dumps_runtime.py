"""check-dump --slime-debug: slime's own debug rollout / train dumps next to msprobe's (issue 18, item 5).

The dumps are written by slime's own writers from the four release archives
(tests/runtime/slime_debug_writer.py says what is real and what stands in); the format 2 train
dump (after v0.3.1, in no archive) is written from its documented structure: derived. The actor
side (`update_actor_log.jsonl` lines and `step*/rank*/dump.json`) is a stand-in written by
tests/slime_actor_log.py in the format of the slime.megatron-actor hook's `_log_step` (the hook
itself runs in tests/runtime/test_runtime_slime.py). The fast part: tests/cli/test_slime_debug_dumps.py.

`test_report_of_slime_logprob_dumps` (issue 30): the same writers with per-sample
`rollout_log_probs` and training `log_probs` (per data-parallel rank, up to v0.3.1) and a known
perturbation, through `rlprobe-patch report`.
"""

from __future__ import annotations

import json
import math
import subprocess
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import TESTS
from script_oracle import SHARED
from slime_actor_log import actor_line, write_actor

from rlprobe_patch.cli import main

UPSTREAM = SHARED / "upstream" / "slime"
RELEASES = ("0.2.2", "0.2.4", "0.3.0", "0.3.1")
WRITER = TESTS / "runtime" / "slime_debug_writer.py"


def _roots(tmp_path: Path) -> list[str]:
    roots = []
    for release in RELEASES:
        folder = tmp_path / "trees" / release
        folder.mkdir(parents=True)
        with tarfile.open(UPSTREAM / f"slime-v{release}.tar.gz") as tar:
            tar.extractall(folder, filter="data")
        roots += ["--slime-root", str(next(folder.iterdir()))]
    return roots


@pytest.mark.skipif(not UPSTREAM.is_dir(), reason="../shared/upstream/slime not here")
def test_slime_debug_dumps_of_the_four_releases(tmp_path: Path) -> None:
    from runtime import venvs

    python = venvs.ensure_megatron_venv()
    roots = _roots(tmp_path)
    proc = subprocess.run(
        [str(python), str(WRITER), *roots, "--out", str(tmp_path / "debug")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    written = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [len(t["files"]) for t in written["trees"]] == [4, 4, 4, 4]
    lines = [actor_line(0, "log_prob", 10), actor_line(1, "log_prob", 11), actor_line(2, "update_actor", 10)]
    actor = write_actor(tmp_path / "actor", lines)
    runner = CliRunner()
    for number, release in enumerate(RELEASES):
        args = ["check-dump", "--actor", str(actor), "--slime-debug", str(tmp_path / "debug" / str(number))]
        result = runner.invoke(main, [*args, "--python", str(python), "--json"])
        assert result.exit_code == 0, (release, result.output)
        data = json.loads(result.stdout)
        rollout, evaluation = data["slime_debug"]["rollouts"]
        assert (rollout["rollout_id"], rollout["evaluation"], evaluation["evaluation"]) == (3, False, True)
        (dump,) = rollout["rollout_dumps"]
        assert dump["sample_indices"] == [10, 11, 12, 13]
        assert dump["request_ids"]["13"] == ["slime-13", "slime-13-1"]  # a resumed sample: two requests
        v1, v2 = sorted(rollout["train_dumps"], key=lambda d: d["format_version"])
        assert (v1["format_version"], v1["rank"], v1["sample_indices"]) == (1, 0, [10, 11, 12, 13])
        assert (v2["format_version"], v2["rollout_positions"]) == (2, [0, 1, 2, 3])
        assert [s["rollout_positions"] for s in v2["dp_shards"]] == [[0, 2], [1, 3]]
        steps = [(s["phase"], s["step"], s["sample_indices"], s["request_ids"]) for s in rollout["actor_steps"]]
        assert steps == [
            ("log_prob", 0, [10], ["slime-10"]),
            ("log_prob", 1, [11], ["slime-11"]),
            ("update_actor", 2, [10], ["slime-10"]),
        ]
        assert rollout["not_in_actor_steps"] == [12, 13]
        assert evaluation["rollout_dumps"][0]["sample_indices"] == [0, 1]  # eval indices restart at 0

    # a broken chain: the actor logs another id than the rollout sent, and a file that is not slime's
    bad = write_actor(tmp_path / "bad", [actor_line(0, "log_prob", 11, "slime-99")])
    (tmp_path / "debug" / "0" / "junk.pt").write_bytes(b"not a torch file")
    args = ["check-dump", "--actor", str(bad), "--slime-debug", str(tmp_path / "debug" / "0")]
    result = runner.invoke(main, [*args, "--python", str(python), "--json"])
    assert result.exit_code == 4, result.output
    problems = json.loads(result.stdout)["problems"]
    assert any("sample 11 logged as slime-99, but the rollout sent slime-11" in p for p in problems)
    assert any("junk.pt: not read" in p for p in problems)


# the writer's samples 10-15: response length 2 + index % 3, rollout log-prob of token k
# -(0.25 + 0.125 k + 0.0625 (index - 10)); the perturbations the writer adds to training's
PERTURB = {12: {None: -0.5}, 14: {1: -0.3}}


def _expected(index: int) -> tuple[int, float, float, float]:
    """Tokens, max and mean |dlogp|, max |dp| of sample `index`, from the writer's figures."""
    length = 2 + index % 3
    offsets = PERTURB.get(index, {})
    deltas = [offsets.get(k, offsets.get(None, 0.0)) for k in range(length)]
    rollout = [-(0.25 + 0.125 * k + 0.0625 * (index - 10)) for k in range(length)]
    dp = [abs(math.exp(r + d) - math.exp(r)) for r, d in zip(rollout, deltas, strict=True)]
    return length, max(map(abs, deltas)), sum(map(abs, deltas)) / length, max(dp)


@pytest.mark.skipif(not UPSTREAM.is_dir(), reason="../shared/upstream/slime not here")
def test_report_of_slime_logprob_dumps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 30: slime's own writers' per-rank dumps -> `report`: per-sample |dlogp|, the perturbed first.

    The report's progress is said from the start, as on a machine where reading the dumps takes over 3 s: its
    lines go to stderr, and stdout stays one JSON document (CI read both as one and failed)."""
    from rlprobe_patch.cli import report as report_cli
    from runtime import venvs

    monkeypatch.setattr(report_cli._Progress.__init__, "__defaults__", (0.0, 10.0))

    python = venvs.ensure_megatron_venv()
    perturb = ["12=-0.5", "14@1=-0.3"]
    proc = subprocess.run(
        [str(python), str(WRITER), "--logprobs", *(f"--perturb={p}" for p in perturb), *_roots(tmp_path)]
        + ["--out", str(tmp_path / "debug")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    written = json.loads(proc.stdout.strip().splitlines()[-1])
    files = ["rollout_data/5.pt", "rollout_data/eval_5.pt", "train_data/5_0.pt", "train_data/5_1.pt"]
    assert [t["files"] for t in written["trees"]] == [files] * len(RELEASES)  # one train file per DP rank
    expected = {f"slime-{i}": _expected(i) for i in range(10, 16)}
    perturbed = sorted(PERTURB, key=lambda i: -expected[f"slime-{i}"][3])
    runner = CliRunner()
    for number, release in enumerate(RELEASES):
        out = tmp_path / "report" / release
        args = ["report", str(tmp_path / "debug" / str(number)), "-o", str(out), "--python", str(python)]
        result = runner.invoke(main, [*args, "--json"])
        assert "... report: " in result.stderr, release
        data = json.loads(result.stdout)
        # the perturbed samples' |dp| puts rollout_probs_diff_mean above verl's 0.01: the default verdict fails
        assert (result.exit_code, data["verdict"]["state"]) == (4, "fail"), (release, result.output)
        assert len(data["inputs"]["slime"]) == 4, release
        assert data["notes"] == [
            f"{tmp_path / 'debug' / str(number) / 'rollout_data' / 'eval_5.pt'}: "
            "an evaluation rollout: no training side, left out"
        ]
        tokens = data["tokens"]
        assert (tokens["samples"], tokens["tokens"]) == (6, sum(e[0] for e in expected.values()))
        requests = tokens["requests"]
        assert [r["request_id"] for r in requests[:2]] == [f"slime-{i}" for i in perturbed], release
        assert [r["rank"] for r in requests] == list(range(1, 7))
        for r in requests:
            length, max_dlogp, mean_dlogp, max_dp = expected[r["request_id"]]
            assert r["tokens"] == length, (release, r)
            assert r["max_abs_dlogp"] == pytest.approx(max_dlogp, abs=1e-6), (release, r)
            assert r["mean_abs_dlogp"] == pytest.approx(mean_dlogp, abs=1e-6), (release, r)
            assert r["max_abs_dp"] == pytest.approx(max_dp, abs=1e-6), (release, r)
            assert r["step"] == 5 and r["kind"] == "slime"
        assert requests[1]["worst_token"]["position"] == 1  # sample 14: only its token 1 was moved
        assert all(r["max_abs_dlogp"] == 0.0 for r in requests[2:])  # float32 of the same floats: equal
        assert data["written"] == {"json": str(out / "report.json"), "html": str(out / "report.html")}
        on_disk = json.loads((out / "report.json").read_text())
        assert [r["request_id"] for r in on_disk["tokens"]["requests"]] == [r["request_id"] for r in requests]
        page = (out / "report.html").read_text()
        assert page.startswith("<!DOCTYPE html>") or page.lstrip().lower().startswith("<!doctype html>")
        assert all(f"slime-{i}" in page for i in PERTURB)
