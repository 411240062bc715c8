"""The vLLM demo's planted token and its noise floor capture (`demo.vllm_consistency`), on small runs written
here: what the real chain's tests (tests/runtime/test_runtime_consistency_demo.py) take as given."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rlprobe_patch.demo.vllm_consistency import CHANGED_AT, FLOOR_RUN, _write_floor, changed_token
from rlprobe_patch.report.capture_format import read_capture


def test_the_token_plant_changes_one_position_within_the_vocabulary() -> None:
    responses = {"a": [0, 1, 2, 3, 4, 5], "b": [9, 9, 9, 255], "c": [7, 7]}  # "c" ends before the position
    changed = changed_token(responses, vocab=256)
    for rid, ids in responses.items():
        moved = [i for i, (x, y) in enumerate(zip(ids, changed[rid])) if x != y]
        assert moved == ([CHANGED_AT] if len(ids) > CHANGED_AT else []) and len(changed[rid]) == len(ids)
        assert all(0 <= t < 256 for t in changed[rid])
    assert changed["b"][CHANGED_AT] == 127  # (255 + 128) % 256


def _run(responses: dict[str, list[int]], logprobs: dict[str, list[float]]) -> dict:
    return {"responses": responses, "logprobs": logprobs, "temperature": 1.0, "logprobs_mode": "raw_logprobs"}


def test_the_floor_covers_each_request_up_to_the_first_token_the_two_runs_sampled_differently(
    tmp_path: Path,
) -> None:
    prompts = [{"request_id": "r0", "input_ids": [1, 2, 3]}, {"request_id": "r1", "input_ids": [4, 5]}]
    single = _run({"r0": [10, 11, 12], "r1": [20, 21, 22]}, {"r0": [-1.0, -2.0, -3.0], "r1": [-4.0, -5.0, -6.0]})
    # batched: r0 the same tokens (one log-prob off by a rounding), r1 another token at position 1
    batched = _run({"r0": [10, 11, 12], "r1": [20, 29, 22]}, {"r0": [-1.0, -2.0000002, -3.0], "r1": [-4.0, -9.0, -6.0]})
    folder, tokens = _write_floor(tmp_path / "floor", prompts, single, batched)
    (path,) = folder.glob("*.npz")
    floor = read_capture(path)
    assert tokens == 4 and floor.mask.tolist() == [[True, True, True], [True, False, False]]
    assert floor.request_ids == ["r0", "r1"] and floor.prompt_lengths.tolist() == [3, 2]
    np.testing.assert_allclose(floor.rollout[floor.mask], [-1.0, -2.0000002, -3.0, -4.0], rtol=1e-7)
    np.testing.assert_allclose(floor.training[floor.mask], [-1.0, -2.0, -3.0, -4.0])
    assert FLOOR_RUN in floor.source and floor.sampling == {"temperature": 1.0, "logprobs_mode": "raw_logprobs"}
