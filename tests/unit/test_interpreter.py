"""The training interpreter asked in a subprocess (`base.interpreter`) and its probes (`base/probes/*.py`).

slime's dump reader is run here by this interpreter with a stand-in `torch` whose `load` unpickles (slime's dumps
are torch pickles of plain dicts and lists); the real torch reads real dumps in
tests/runtime/test_slime_debug_dumps_runtime.py and tests/runtime/test_runtime_slime.py.
"""

from __future__ import annotations

import ast
import pickle
import re
import sys
from pathlib import Path

import pytest

from rlprobe_patch.base import interpreter
from rlprobe_patch.base.errors import InterpreterError, RefusedError
from rlprobe_patch.base.interpreter import PROBES, find_spec, finds, packages, run_probe
from rlprobe_patch.dumps.slime import is_evaluation, read_slime_dumps

STAND_IN_TORCH = """
import pickle


def load(path, map_location=None, weights_only=True):
    with open(path, "rb") as f:
        return pickle.load(f)
"""


def test_every_probe_is_a_python_file_the_module_names() -> None:
    probes = sorted(p.stem for p in PROBES.glob("*.py"))
    assert len(probes) >= 6
    named = re.findall(r"^    (\w+)\.py ", interpreter.__doc__ or "", re.M)
    assert sorted(named) == probes
    for name in probes:
        ast.parse(interpreter.probe_text(name))  # real Python, as ruff reads it


def test_find_spec_asks_the_interpreter_without_importing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "rlprobe_probe_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("raise SystemExit('imported')\n")  # find_spec must not run it
    (tmp_path / "rlprobe_probe_mod.py").write_text("raise SystemExit('imported')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the child's; this process never sees the folder
    assert find_spec(None, "rlprobe_probe_pkg") == [str(package)]
    assert find_spec(None, "rlprobe_probe_mod") == []  # a module, no package folder
    assert find_spec(None, "rlprobe_no_such_module") is None


def test_an_interpreter_that_is_not_there_is_refused(tmp_path: Path) -> None:
    missing = str(tmp_path / "bin" / "python")
    with pytest.raises(InterpreterError, match=re.escape(f"--python {missing}: no such interpreter")):
        find_spec(missing, "json")
    assert finds(missing, "json") is None  # the script reader: cannot say


def test_finds_in_this_process_and_in_another_interpreter(tmp_path: Path) -> None:
    assert finds(sys.executable, "json") is True and finds(sys.executable, "rlprobe_no_such_module") is False
    other = tmp_path / "python"
    other.symlink_to(sys.executable)  # another path: asked in a subprocess
    assert finds(str(other), "json") is True and finds(str(other), "rlprobe_no_such_module") is False


def test_packages_reads_versions_from_metadata() -> None:
    found, info = packages(None)
    assert info["python"] == sys.executable and info["python_version"] == sys.version.split()[0]
    assert set(found) == set(interpreter.PACKAGES)
    assert not found["verl"].found and found["verl"].version is None  # not in the tool's own venv


def test_a_probe_that_prints_nothing_is_refused_with_its_stderr() -> None:
    proc = run_probe(None, "find_spec")  # no argument: it fails
    assert proc.returncode != 0
    with pytest.raises(InterpreterError, match="IndexError"):
        interpreter.last_json(proc, "find_spec without a name")


def _dump(path: Path, data: object) -> Path:
    path.write_bytes(pickle.dumps(data))
    return path


def test_one_slime_reader_gives_check_dump_and_report_their_readings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(STAND_IN_TORCH)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    rollout = _dump(
        tmp_path / "rollout_3.pt",
        {
            "rollout_id": 3,
            "samples": [
                {"index": 7, "status": "completed", "tokens": [1, 2, 3], "response_length": 2, "prompt": "hi",
                 "rollout_log_probs": [-0.5, -0.25], "metadata": {"rlprobe_request_ids": ["r7"]}},
                "not a sample",
                {"index": 8, "status": "aborted", "tokens": [4, 5], "response_length": 1, "prompt": [{"role": "user"}],
                 "rollout_log_probs": [-1.0]},
            ],
        },
    )  # fmt: skip
    train_v1 = _dump(
        tmp_path / "train_3_rank0.pt",
        {
            "rollout_id": 3,
            "rank": 0,
            "rollout_data": {
                "sample_indices": [7, 8],
                "partition": [0, 2],
                "log_probs": [[-0.5, -0.3], [-1.5]],
                "rollout_log_probs": [[-0.5, -0.25], [-1.0]],
                "response_lengths": [2, 1],
                "tokens": [[1, 2, 3], [4, 5]],
            },
        },
    )
    train_v2 = _dump(
        tmp_path / "train_4_rank1.pt",
        {
            "rollout_id": 4,
            "rank": 1,
            "format_version": 2,
            "samples": [{"sample_index": 9, "rollout_position": 1, "log_probs": [-0.1], "response_length": 1,
                         "tokens": [6, 7]}],
            "dp_shards": [{"dp_rank": 0, "positions": [1], "sample_indices": [9]}, [0]],
        },
    )  # fmt: skip
    evaluation = _dump(tmp_path / "eval_5.pt", {"rollout_id": 5, "samples": []})
    listed = _dump(tmp_path / "list.pt", [1, 2])
    other = _dump(tmp_path / "other.pt", {"weights": 1})
    broken = tmp_path / "broken.pt"
    broken.write_bytes(b"not a pickle")

    items = read_slime_dumps([rollout, train_v1, train_v2, evaluation, listed, other, broken], None, timeout=60)
    check = [item["check"] for item in items]
    logprobs = [item["logprobs"] for item in items]
    assert check[0] == {
        "path": str(rollout),
        "keys": ["rollout_id", "samples"],
        "rollout_id": 3,
        "rank": None,
        "format_version": None,
        "kind": "rollout",
        "samples": [
            {"index": 7, "status": "completed", "request_ids": ["r7"]},
            {"index": 8, "status": "aborted", "request_ids": None},
        ],
    }
    assert logprobs[0]["kind"] == "rollout" and logprobs[0]["samples"] == [
        {"sample_index": 7, "rollout_position": 0, "rollout_log_probs": [-0.5, -0.25], "response_length": 2,
         "tokens": [1, 2, 3], "prompt": "hi", "request_id": "r7"},
        {"sample_index": 8, "rollout_position": 2, "rollout_log_probs": [-1.0], "response_length": 1,
         "tokens": [4, 5], "prompt": '[{"role": "user"}]', "request_id": None},
    ]  # fmt: skip
    assert check[1] == {
        "path": str(train_v1),
        "keys": ["rank", "rollout_data", "rollout_id"],
        "rollout_id": 3,
        "rank": 0,
        "format_version": None,
        "kind": "train",
        "sample_indices": [7, 8],
        "rollout_positions": [0, 2],
        "rollout_data_keys": ["log_probs", "partition", "response_lengths", "rollout_log_probs", "sample_indices",
                              "tokens"],
    }  # fmt: skip
    assert logprobs[1] == {
        "path": str(train_v1),
        "rollout_id": 3,
        "kind": "train",
        "format_version": 1,
        "samples": [
            {"sample_index": 7, "rollout_position": 0, "log_probs": [-0.5, -0.3], "rollout_log_probs": [-0.5, -0.25],
             "response_length": 2, "tokens": [1, 2, 3]},
            {"sample_index": 8, "rollout_position": 2, "log_probs": [-1.5], "rollout_log_probs": [-1.0],
             "response_length": 1, "tokens": [4, 5]},
        ],
    }  # fmt: skip
    assert check[2]["kind"] == "train" and check[2]["sample_indices"] == [9] and check[2]["rollout_positions"] == [1]
    assert check[2]["dp_shards"] == [
        {"dp_rank": 0, "rollout_positions": [1], "sample_indices": [9]},
        {"dp_rank": 1, "rollout_positions": [0], "sample_indices": None},
    ]
    assert logprobs[2]["format_version"] == 2 and logprobs[2]["samples"] == [
        {"sample_index": 9, "rollout_position": 1, "log_probs": [-0.1], "rollout_log_probs": None,
         "response_length": 1, "tokens": [6, 7]},
    ]  # fmt: skip
    assert is_evaluation(check[3]["path"]) and not is_evaluation(check[0]["path"])
    assert check[4]["error"] == logprobs[4]["error"] == "holds a list, not slime's dict"
    assert check[5]["error"] == logprobs[5]["error"]
    assert check[5]["error"].startswith("neither a rollout dump")
    assert check[6]["error"].startswith("UnpicklingError") and check[6]["error"] == logprobs[6]["error"]


def test_slime_dumps_without_torch_are_refused_naming_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "torch.py").write_text("raise ImportError('no torch here')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    files = [tmp_path / "a.pt", tmp_path / "b.pt"]
    with pytest.raises(RefusedError) as raised:
        read_slime_dumps(files, None, timeout=60)
    assert (
        raised.value.message == f"cannot read slime's debug dumps ({files[0]} and 1 more): ImportError: no torch here"
    )
    assert "--python" in raised.value.hint
