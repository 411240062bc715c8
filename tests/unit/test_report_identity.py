"""The identity check (`report.identity`), the rollout engine's record (`report.rollout_record`) and the weight
fingerprints (`report.weights`): what each names, and what each refuses as input it cannot trust."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rlprobe_patch.base.errors import RefusedError
from rlprobe_patch.report.capture_format import TokenBatch
from rlprobe_patch.report.identity import (
    check_step,
    compare_prompt,
    compare_response,
    identity_rows,
    index_records,
    weights_for_step,
)
from rlprobe_patch.report.rollout_record import parse_record, read_records
from rlprobe_patch.report.weights import compare_weights, read_weights

TEMPLATED = (1, 9, 9, 2, 50, 51, 52, 3, 4)  # <s> system ... <user> text <end> <assistant>
TEXT = (50, 51, 52)


@pytest.mark.parametrize(
    ("training", "engine", "kind", "position"),
    [
        (TEXT, TEMPLATED, "template", 0),  # the trainer scored the text alone
        (TEMPLATED[:6], TEMPLATED, "truncation", 6),  # cut at 6 tokens
        ((1, 9, 9, 2, 50, 77, 52, 3, 4), TEMPLATED, "tokenization", 5),  # another id inside
    ],
)
def test_a_prompt_that_differs_is_named_with_its_first_differing_position(
    training: tuple[int, ...], engine: tuple[int, ...], kind: str, position: int
) -> None:
    found = compare_prompt("r", 0, training, engine)
    assert found is not None and (found.part, found.kind, found.position) == ("prompt", kind, position)
    assert f"from position {position}" in found.said and kind in found.said
    assert compare_prompt("r", 0, engine, engine) is None


def test_a_response_that_differs_is_a_token_or_a_truncation() -> None:
    token = compare_response("r", 0, (5, 6, 99, 8), (5, 6, 7, 8))
    assert token is not None and (token.kind, token.position) == ("token", 2) and "engine id 7" in token.said
    cut = compare_response("r", 0, (5, 6), (5, 6, 7, 8))
    assert cut is not None and (cut.kind, cut.position, cut.training, cut.engine) == ("truncation", 2, 2, 4)


def _record(rid: str, prompt: tuple[int, ...], output: tuple[int, ...], **extra: object) -> str:
    line = {
        "format": "rlprobe-rollout",
        "format_version": 1,
        "engine": "vllm",
        "engine_version": "x",
        "request_id": rid,
        "prompt_ids": list(prompt),
        "output_ids": list(output),
        "finish_reason": "length",
        "sampling": {"temperature": 0.7, "top_p": 0.8, "top_k": 0, "seed": 3},
        "logprobs_mode": "processed_logprobs",
        "dtype": "bfloat16",
        **extra,
    }
    return json.dumps(line)


def _batch(prompts: list[tuple[int, ...]], responses: list[tuple[int, ...]], ids: list[str]) -> TokenBatch:
    width, pwidth = max(map(len, responses)), max(map(len, prompts))
    resp = np.array([list(r) + [0] * (width - len(r)) for r in responses])
    mask = np.array([[True] * len(r) + [False] * (width - len(r)) for r in responses])
    return TokenBatch(
        path="c",
        kind="verl-capture",
        step=1,
        request_ids=ids,
        prompt_lengths=np.array([len(p) for p in prompts]),
        responses=resp,
        mask=mask,
        rollout=np.full(resp.shape, -1.0),
        training=np.full(resp.shape, -1.0),
        prompt_ids=np.array([list(p) + [0] * (pwidth - len(p)) for p in prompts]),
    )


def test_a_step_joins_the_engines_records_by_the_id_it_was_sent(tmp_path: Path) -> None:
    """vLLM appends `-<8 hex>` to the id it is sent; the join strips it. The engine's settings are what it applied."""
    path = tmp_path / "r.rlprobe-rollout.jsonl"
    path.write_text(
        "\n".join(
            [
                _record("a-0123abcd", TEMPLATED, (5, 6, 7)),
                _record("b-89abcdef", TEMPLATED, (8, 9)),
                _record("unrelated-00000000", TEXT, (1,)),
            ]
        )
        + "\n\n"
    )
    records = read_records(path)
    assert [r.sent_id for r in records] == ["a", "b", "unrelated"]
    batch = _batch([TEMPLATED, TEXT], [(5, 6, 7), (8, 9)], ["a", "b"])
    identity = check_step(batch, index_records(records))
    assert (identity.joined, identity.prompts_compared) == (2, 2)
    assert [(d.request_id, d.part, d.kind) for d in identity.differences] == [("b", "prompt", "template")]
    assert identity.engine["temperature"] == 0.7 and identity.engine["dtype"] == "bfloat16"
    assert identity_rows(batch, identity).tolist() == [[True, True, True], [False, False, False]]
    assert "1 of 2 joined request(s) differ (1 prompt template)" in identity.summary()


@pytest.mark.parametrize(
    ("line", "said"),
    [
        (
            '{"format": "rlprobe-rollout", "format_version": 1, "engine": "vllm", "request_id": "a", "prompt_ids": [1, '
            '"2"], "output_ids": [], "dtype": "float32"}',
            "prompt_ids is not a list of token ids",
        ),
        ('{"format": "other"}', "not an rlprobe-rollout record"),
        ('{"format": "rlprobe-rollout", "format_version": 9}', "version 9"),
        ("{" * 100000, "not JSON"),
        ('{"format": "rlprobe-rollout"', "not JSON"),
    ],
)
def test_a_record_line_that_is_not_one_is_refused_naming_the_file_and_line(
    tmp_path: Path, line: str, said: str
) -> None:
    path = tmp_path / "x.rlprobe-rollout.jsonl"
    path.write_text(_record("ok", (1,), (2,)) + "\n" + line + "\n")
    with pytest.raises(RefusedError, match=said) as refused:
        read_records(path)
    assert f"{path}:2" in refused.value.message


def test_sampling_settings_of_a_record_are_scalars_only() -> None:
    with pytest.raises(RefusedError, match="sampling is not a short object"):
        parse_record("f:1", _record("a", (1,), (2,), sampling={"temperature": [1, 2]}))


def _weights(tmp_path: Path, name: str, side: str, dtype: str, tensors: dict[str, str], step: int | None) -> Path:
    path = tmp_path / f"{name}.rlprobe-weights.json"
    body = {n: {"sha256": h * 64, "numel": 4, "sum": 1.0} for n, h in tensors.items()}
    document = {"format": "rlprobe-weights", "format_version": 1, "side": side, "engine": "e", "step": step}
    path.write_text(json.dumps(document | {"dtype": dtype, "tensors": body}))
    return path


def test_fingerprints_name_the_tensors_a_sync_left_behind(tmp_path: Path) -> None:
    trainer = read_weights(_weights(tmp_path, "t", "training", "float32", {"a": "1", "b": "2", "c": "3"}, None))
    half = read_weights(_weights(tmp_path, "r", "rollout", "float32", {"a": "1", "b": "9", "c": "3"}, 2))
    other = read_weights(_weights(tmp_path, "o", "rollout", "bfloat16", {"a": "1", "b": "2", "c": "3"}, 2))
    found = compare_weights(trainer, half)
    assert found.comparable and (found.compared, found.differing) == (3, ["b"])
    assert weights_for_step(2, [trainer], [half]) == found and weights_for_step(1, [trainer], [half]) is None
    not_comparable = compare_weights(trainer, other)
    assert not not_comparable.comparable and "not compared" in not_comparable.note


@pytest.mark.parametrize(
    ("document", "said"),
    [
        ({"format": "rlprobe-weights", "format_version": 1, "side": "both"}, "side is 'both'"),
        (
            {
                "format": "rlprobe-weights",
                "format_version": 1,
                "side": "rollout",
                "dtype": "f",
                "engine": "e",
                "tensors": {"a": {"sha256": "zz", "numel": 1, "sum": 0}},
            },
            "sha256 is not 64 hex digits",
        ),
        ({"format": "rlprobe-weights", "format_version": 2}, "version 2"),
    ],
)
def test_a_fingerprint_file_that_is_not_one_is_refused(tmp_path: Path, document: dict, said: str) -> None:
    path = tmp_path / "w.rlprobe-weights.json"
    path.write_text(json.dumps(document))
    with pytest.raises(RefusedError, match=said):
        read_weights(path)
