"""`verl.logprob-capture` on every real verl release of the catalogue (issue 30).

Each cell: apply on its own (`--only`), verify, py_compile of every touched file, a second apply
that writes nothing, and a revert that leaves every file byte-identical; the sites it edits are
the trainers that compute verl's debug metrics in that release (V0 always, the separated trainer
from 0.7.1, the V1 trainer from 0.9.0). Releases before 0.6.0 are refused.

The capture's provenance on each release's own config, composed by Hydra with a launch's overrides:
the actor's and the rollout's dtypes as that release's code decides them (the premises read from its
files first).
"""

from __future__ import annotations

import json
import py_compile
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from conftest import REFUSED_RELEASES, VERL_RELEASES, cli_json, hydra_args, snapshot
from packaging.version import Version
from script_oracle import verl_root

from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.catalogue.patches import patches_dir
from rlprobe_patch.codemod import Payload
from rlprobe_patch.launch.hydra_compose import compose_launch

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
    """The V1 capture reads `extra_fields`, `index`, `raw_prompt` and `input_ids` from TransferQueue:
    each row the release's agent loop stores is `AgentLoopOutput.as_dict()` (its `extra_fields`, where
    `verl.request-id` keeps the request id) updated with the prompt's kwargs (RLHFDataset's `index`
    and `raw_prompt`), then `input_ids` (the prompt, then the response: what the actor scores), tagged
    with `prompt_len` (the prompt's length). The trainer imports TransferQueue already: the capture's
    import is a lookup."""
    root = real_tree(version)
    agent_loop = (root / "verl/trainer/ppo/v1/agent_loop_tq.py").read_text()
    assert "field = output.as_dict()" in agent_loop and "field.update(kwargs)" in agent_loop
    assert "input_ids = torch.cat([prompts, responses], dim=0)" in agent_loop
    assert 'field["input_ids"] = input_ids' in agent_loop and '"prompt_len": prompt_len' in agent_loop
    assert '"extra_fields"' in (root / "verl/experimental/agent_loop/agent_loop.py").read_text()
    dataset = (root / "verl/utils/dataset/rl_dataset.py").read_text()
    assert 'row_dict["index"] = ' in dataset and 'row_dict["raw_prompt"] = ' in dataset
    assert "import transfer_queue as tq" in (root / V1).read_text()

    code, out = cli_json("apply", "--verl-root", root, "--backend", "fsdp", "--mode", "consistency")
    assert code == ExitCode.OK, out
    trainer = (root / V1).read_text()
    assert "_RlprobeLogprobCapture()._rlprobe_capture_kv_logprobs(self, batch, data)" in trainer
    assert '("extra_fields", "index", "raw_prompt", "input_ids")' in trainer
    assert 'extra_fields["request_id"] = vllm_request_id' in (root / "verl/workers/rollout/llm_server.py").read_text()


# -- provenance: the dtypes each side computes in, as each release's composed config sets them -----
def capture_class() -> Any:
    """The inserted class `_RlprobeLogprobCapture`, as the codemod inserts it (shared parts spliced)."""
    code = Payload(patches_dir() / PATCH / "payload.py").module.code
    namespace: dict[str, Any] = {}
    exec(compile(code.replace("from _shared.switches import Switches\n", ""), PATCH, "exec"), namespace)
    return namespace["_RlprobeLogprobCapture"]


def release_source(root: Path, rel: str) -> str:
    path = root / "verl" / rel
    return path.read_text(encoding="utf-8") if path.is_file() else ""


def check_premises(root: Path, version: Version) -> None:
    """What the expectations below rest on, read from the release's own code: where its FSDP and
    Megatron actors take their compute dtype from, and that its rollout servers pass rollout.dtype."""
    legacy_actor = release_source(root, "workers/actor/dp_actor.py")
    fsdp_engine = release_source(root, "workers/engine/fsdp/transformer_impl.py")
    megatron_engine = release_source(root, "workers/engine/megatron/transformer_impl.py")
    if version < Version("0.8.0"):  # the legacy workers run the actor (0.7.x: unless disabled)
        if version < Version("0.6.1"):
            assert "torch.autocast(device_type=self.device_name, dtype=torch.bfloat16)" in legacy_actor
        else:
            assert "torch.autocast(device_type=self.device_name, dtype=self.param_dtype)" in legacy_actor
            assert 'PrecisionType.to_dtype(self.config.fsdp_config.get("dtype", "bfloat16"))' in legacy_actor
        assert "torch.autocast(device_type=device_name, dtype=torch.bfloat16)" in fsdp_engine
    else:  # the engine workers only, autocasting to the FSDP param dtype
        assert (
            not (root / "verl/workers/fsdp_workers.py").exists() and "self._autocast_dtype = param_dtype" in fsdp_engine
        )
        assert 'param_dtype = PrecisionType.to_dtype(mixed_precision_config.get("param_dtype", "bf16"))' in fsdp_engine
    if version < Version("0.6.1"):
        assert "self.param_dtype = torch.bfloat16" in megatron_engine
    else:
        assert "self.param_dtype = PrecisionType.to_dtype(self.engine_config.dtype)" in megatron_engine
    assert '"dtype": self.config.dtype' in release_source(root, "workers/rollout/vllm_rollout/vllm_async_server.py")


MEGATRON = "--config-name=ppo_megatron_trainer"


def launches(version: Version) -> list[tuple[list[str], str, str, str]]:
    """(a launch's arguments, the actor's strategy, the dtypes its actor and its rollout compute in), as
    the premises say for `version`: the defaults, and a launch per rule the release has."""
    legacy = version < Version("0.8.0")  # trainer.use_legacy_worker_impl exists; the legacy workers by default
    param_fp32 = "+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32"
    runs = [
        ([], "fsdp", "bfloat16", "bfloat16"),
        ([MEGATRON], "megatron", "bfloat16", "bfloat16"),
        # the engine workers compute in mixed_precision's param dtype; the legacy ones autocast to fsdp_config.dtype
        (
            ["actor_rollout_ref.rollout.dtype=float16", param_fp32],
            "fsdp",
            "bfloat16" if legacy else "float32",
            "float16",
        ),
    ]
    if version >= Version("0.6.1"):  # fsdp_config.dtype and megatron.dtype exist
        fp16 = "actor_rollout_ref.actor.fsdp_config.dtype=float16"
        runs.append(([fp16], "fsdp", "float16" if legacy else "bfloat16", "bfloat16"))
        runs.append(([MEGATRON, "actor_rollout_ref.actor.megatron.dtype=float16"], "megatron", "float16", "bfloat16"))
        if legacy:  # disable: the engine workers where the release has them (0.7.x), autocasting to bfloat16
            engine = version >= Version("0.7.0")
            disable = ["trainer.use_legacy_worker_impl=disable", fp16]
            runs.append((disable, "fsdp", "bfloat16" if engine else "float16", "bfloat16"))
    return runs


@pytest.mark.parametrize("version", SUPPORTED)
def test_provenance_from_the_composed_config(version: str, monkeypatch: pytest.MonkeyPatch) -> None:
    root = verl_root(version)
    release = Version(version)
    check_premises(root, release)
    # `verl` and `verl.workers` as the trainer's process has them (the release's own folders and version),
    # without importing them: the provenance asks whether verl.workers.engine_workers exists
    verl = types.ModuleType("verl")
    verl.__path__ = [str(root / "verl")]
    verl.__version__ = (root / "verl/version/version").read_text().strip()  # type: ignore[attr-defined]
    workers = types.ModuleType("verl.workers")
    workers.__path__ = [str(root / "verl/workers")]
    monkeypatch.setitem(sys.modules, "verl", verl)
    monkeypatch.setitem(sys.modules, "verl.workers", workers)
    capture = capture_class()
    for args, strategy, training, rollout in launches(release):
        composed = compose_launch(root, "verl.trainer.main_ppo", hydra_args(*args), cwd=Path.cwd())
        assert not composed.errors, (args, composed.errors)
        provenance = json.loads(capture()._rlprobe_provenance(types.SimpleNamespace(config=composed.config)))
        expected = {"verl_version": version, "training_strategy": strategy, "training_dtype": training}
        assert provenance == {**expected, "rollout_dtype": rollout}, args
