"""Every number of report.json stays what it was when pinned (tests/report_numbers.py says which reports).

A float is the pinned one to 1e-12 of its size: numpy's kernels sum and exponentiate with the vector width of the
CPU they run on, so the same code gives a last bit of its own on another machine (seen on CI: 13 numbers, each
1-2 units in the last place off). Any change of the computation moves a number by far more than that."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from report_numbers import CASES, DATA, report_json

# a float's tolerance, relative: the last bits a machine's SIMD kernels choose, never a changed computation
REL_TOL = 1e-12


def _differences(got: Any, pinned: Any, where: str = "") -> list[str]:
    """Where `got` differs from `pinned`: a float by more than REL_TOL of its size, an int, a string, a key, a
    list's length."""
    if isinstance(pinned, dict) and isinstance(got, dict):
        found = [f"{where}.{k}: missing" for k in pinned if k not in got]
        found += [f"{where}.{k}: not pinned" for k in got if k not in pinned]
        for k in pinned.keys() & got.keys():
            found += _differences(got[k], pinned[k], f"{where}.{k}")
        return found
    if isinstance(pinned, list) and isinstance(got, list):
        if len(got) != len(pinned):
            return [f"{where}: {len(got)} entries, pinned {len(pinned)}"]
        return [d for i, (g, p) in enumerate(zip(got, pinned)) for d in _differences(g, p, f"{where}[{i}]")]
    # a float to REL_TOL, an int as an int: 1.0 is not 1
    if type(got) is float and type(pinned) is float:
        close = math.isclose(got, pinned, rel_tol=REL_TOL, abs_tol=0.0)
        return [] if close else [f"{where}: {got!r}, pinned {pinned!r}"]
    if type(got) is not type(pinned) or got != pinned:
        return [f"{where}: {got!r}, pinned {pinned!r}"]
    return []


@pytest.mark.parametrize("case", list(CASES))
def test_report_json_is_the_pinned_one(case: str, tmp_path: Path) -> None:
    pinned = json.loads(DATA.read_text())[case]
    got = report_json(case, tmp_path)
    differences = _differences(got, pinned)
    assert not differences, f"{len(differences)} difference(s) in {case}'s report.json:\n" + "\n".join(differences[:40])


def test_the_comparison_sees_a_change_but_not_a_last_bit() -> None:
    """The check itself: a float off by 1e-11 of its size, an int for a float, a list cut short are each a
    difference; a float's last bits (CI's numpy on another CPU) are not."""
    pinned = {"a": [0.1, 2, {"b": 1.0}], "c": "x"}
    assert _differences(json.loads(json.dumps(pinned)), pinned) == []
    ci = {"a": [math.nextafter(math.nextafter(0.1, 1.0), 1.0), 2, {"b": 1.0}], "c": "x"}  # two ulps, as CI saw
    assert _differences(ci, pinned) == []
    moved = 0.1 * (1 + 1e-11)
    assert _differences({"a": [moved, 2, {"b": 1.0}], "c": "x"}, pinned) == [f".a[0]: {moved!r}, pinned 0.1"]
    assert _differences({"a": [0.0, 2, {"b": 1.0}], "c": "x"}, pinned) == [".a[0]: 0.0, pinned 0.1"]
    assert _differences({"a": [0.1, 2, {"b": 1}], "c": "x"}, pinned) == [".a[2].b: 1, pinned 1.0"]
    assert _differences({"a": [0.1, 2], "c": "x"}, pinned) == [".a: 2 entries, pinned 3"]


def test_threads_compute_what_one_thread_does(tmp_path: Path) -> None:
    """The report takes its figures and judges its steps in threads, each step judged as soon as its figures are
    taken (`build`, without a layer compare): every figure and every cause equal to the single thread's taking the
    figures first and judging the steps after (`token_report`, then `diagnose`), to the bit."""
    from concurrent.futures import ThreadPoolExecutor

    from report_numbers import write_captures

    from rlprobe_patch.report import json_text
    from rlprobe_patch.report.build import build, classify, read_inputs, step_tokens, token_report
    from rlprobe_patch.report.diagnosis import diagnose
    from rlprobe_patch.report.floor import choose_floor
    from rlprobe_patch.report.verdict import grade_steps

    write_captures(tmp_path)
    batches = read_inputs(classify([tmp_path]), None)[0]
    floor = choose_floor(batches, [], 1)  # step 1 as the floor: the other two judged against a measured one
    alone = token_report(batches), diagnose(batches, None, floor, clip=(0.2, 0.28))
    with ThreadPoolExecutor(max_workers=2) as pool:
        parts = step_tokens(batches)
        side_by_side = (
            token_report(batches, parts, pool),
            diagnose(batches, None, floor, clip=(0.2, 0.28), parts=parts, pool=pool),
        )
    assert json.dumps(side_by_side) == json.dumps(alone)
    assert len(alone[0]["steps"]) == 3 and alone[0]["tokens"] > 20_000
    assert len(alone[1]["steps"]) == 3 and alone[1]["top"] != "precision-noise"
    # the command's way: each step judged in the thread that took its figures (against its grade by verl's
    # guidance), its values freed after
    report = build(batches, [], {}, floor, clip=(0.2, 0.28))
    guidance = {index: grade["state"] for index, grade in enumerate(grade_steps({"tokens": alone[0]}))}
    assert "warn" in guidance.values()
    after = diagnose(batches, None, floor, guidance=guidance, clip=(0.2, 0.28))
    requests = report["tokens"].pop("requests")
    assert json.dumps(list(requests)) == json.dumps(alone[0]["requests"])
    # each request's text made with its step, its rank added after: the encoder's text of the request as it is
    assert requests.texts() == [json_text(request) for request in requests]
    assert sum('"rank": ' in text for text in requests.texts()) == sum(1 for r in requests if r["tokens"]) > 50
    assert json.dumps([report["tokens"], report["diagnosis"]]) == json.dumps(
        [{k: v for k, v in alone[0].items() if k != "requests"}, after]
    )


@pytest.mark.parametrize("group", [1, 10_000])
def test_groups_of_steps_compute_what_one_group_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, group: int
) -> None:
    """Issue 45: the report takes the steps' values in groups of at least `GROUP_TOKENS` tokens (one group here by
    default: three steps of about 9,000 tokens), freeing each group's as it is done. Each step its own group, or two
    steps a group: every figure, request and cause the same, to the bit."""
    from report_numbers import write_captures

    from rlprobe_patch.report import build as report_build
    from rlprobe_patch.report.floor import choose_floor

    write_captures(tmp_path)
    batches = report_build.read_inputs(report_build.classify([tmp_path]), None)[0]
    floor = choose_floor(batches, [], 1)

    def made() -> tuple[str, int]:
        parts = report_build.step_tokens(batches)
        report = report_build.build(batches, [], {}, floor, clip=(0.2, 0.28))
        report["tokens"]["requests"] = list(report["tokens"]["requests"])
        return json.dumps(report), len({id(part.whole) for part in parts})

    one, groups = made()
    assert groups == 1
    monkeypatch.setattr(report_build, "GROUP_TOKENS", group)
    apart, groups = made()
    assert groups == (3 if group == 1 else 2)
    assert apart == one
