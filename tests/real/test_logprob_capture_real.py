"""`verl.logprob-capture` on every real verl release of the catalogue (issue 30).

Each cell: apply on its own (`--only`), verify, py_compile of every touched file, a second apply
that writes nothing, and a revert that leaves every file byte-identical; the sites it edits are
the trainers that compute verl's debug metrics in that release (V0 always, the separated trainer
from 0.7.1, the V1 trainer from 0.9.0). Releases before 0.6.0 are refused.
"""

from __future__ import annotations

import py_compile

import pytest
from conftest import REFUSED_RELEASES, VERL_RELEASES, cli_json, snapshot
from packaging.version import Version

from rlprobe_patch.errors import ExitCode

PATCH = "verl.logprob-capture"
SUPPORTED = [v for v in VERL_RELEASES if Version(v) >= Version("0.6.0")]
V0 = "verl/trainer/ppo/ray_trainer.py"
SEPARATE = "verl/experimental/separation/ray_trainer.py"
V1 = "verl/trainer/ppo/v1/trainer_base.py"


def expected_files(version: str) -> list[str]:
    files = [V0]
    if Version(version) >= Version("0.7.1"):
        files.append(SEPARATE)
    if Version(version) >= Version("0.9.0"):
        files.append(V1)
    return sorted(files)


@pytest.mark.parametrize("version", SUPPORTED)
def test_logprob_capture_cell(real_tree, version: str) -> None:
    root = real_tree(version)
    original = snapshot(root)
    code, out = cli_json("apply", "--verl-root", root, "--backend", "fsdp", "--only", PATCH)
    assert code == ExitCode.OK, out
    assert out["status"] == "applied" and sorted(out["files"]) == expected_files(version)
    for rel in out["files"]:
        text = (root / rel).read_text()
        assert text.count("_RlprobeLogprobCapture()._rlprobe_capture_precondition(self)") == 1, rel
        assert text.count("# rlprobe-patch: MISMATCH_ON") == 2, rel
        py_compile.compile(str(root / rel), doraise=True, cfile=str(root.parent / "compiled.pyc"))

    code, out = cli_json("verify", "--verl-root", root)
    assert code == ExitCode.OK, [c for t in out["trees"] for c in t["checks"] if not c["ok"]]
    assert any(c["check"].startswith(f"{PATCH}: hooks in place") for t in out["trees"] for c in t["checks"])

    patched = snapshot(root)
    code, out = cli_json("apply", "--verl-root", root, "--backend", "fsdp", "--only", PATCH)
    assert code == ExitCode.OK and out["status"] == "already applied" and out["files"] == []
    assert snapshot(root) == patched

    assert cli_json("revert", "--verl-root", root)[0] == ExitCode.OK
    assert snapshot(root) == original


@pytest.mark.parametrize("version", [v for v in [*VERL_RELEASES, *REFUSED_RELEASES] if Version(v) < Version("0.6.0")])
def test_logprob_capture_refused_before_debug_metrics(real_tree, version: str) -> None:
    root = real_tree(version)
    code, out = cli_json("apply", "--verl-root", root, "--backend", "fsdp", "--only", PATCH)
    assert code == ExitCode.REFUSED, out
    assert "has no calculate_debug_metrics" in " ".join(out["details"])
    assert not (root / ".rlprobe-patch").exists()


@pytest.mark.parametrize("version", [v for v in SUPPORTED if Version(v) >= Version("0.9.0")])
def test_v1_capture_reads_fields_the_release_stores(real_tree, version: str) -> None:
    """The V1 capture reads `extra_fields`, `index` and `raw_prompt` from TransferQueue: each row the
    release's agent loop stores is `AgentLoopOutput.as_dict()` (its `extra_fields`, where
    `verl.request-id` keeps the request id) updated with the prompt's kwargs (RLHFDataset's `index`
    and `raw_prompt`). The trainer imports TransferQueue already: the capture's import is a lookup."""
    root = real_tree(version)
    agent_loop = (root / "verl/trainer/ppo/v1/agent_loop_tq.py").read_text()
    assert "field = output.as_dict()" in agent_loop and "field.update(kwargs)" in agent_loop
    assert '"extra_fields"' in (root / "verl/experimental/agent_loop/agent_loop.py").read_text()
    dataset = (root / "verl/utils/dataset/rl_dataset.py").read_text()
    assert 'row_dict["index"] = ' in dataset and 'row_dict["raw_prompt"] = ' in dataset
    assert "import transfer_queue as tq" in (root / V1).read_text()

    code, out = cli_json("apply", "--verl-root", root, "--backend", "fsdp", "--mode", "consistency")
    assert code == ExitCode.OK, out
    trainer = (root / V1).read_text()
    assert "_RlprobeLogprobCapture()._rlprobe_capture_kv_logprobs(self, batch, data)" in trainer
    assert '("extra_fields", "index", "raw_prompt")' in trainer
    assert 'extra_fields["request_id"] = vllm_request_id' in (root / "verl/workers/rollout/llm_server.py").read_text()
