"""The apply/revert laws as properties over patches, releases and file modes (hypothesis).

For any release, backend and worker path drawn, on a real verl tree from the index:
apply∘apply = apply (the second writes nothing), verify(apply(t)) passes (our checks, the
skill's rules, and `git apply --check -R` of the recorded diff), and revert∘apply = identity
for every file's bytes and mode, whatever modes the target files had.
"""

from __future__ import annotations

import shutil
import zipfile

from conftest import VERL_RELEASES, cli_json, snapshot, verl_wheel
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlprobe_patch.base.errors import ExitCode

TARGETS = (
    "verl/workers/engine/fsdp/transformer_impl.py",
    "verl/workers/engine/megatron/transformer_impl.py",
    "verl/trainer/ppo/ray_trainer.py",
    "verl/utils/debug/metrics.py",
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    version=st.sampled_from(VERL_RELEASES),
    backend=st.sampled_from(["fsdp", "fsdp2", "megatron"]),
    worker_impl=st.sampled_from(["auto", "engine"]),
    consistency=st.booleans(),
    modes=st.lists(st.sampled_from([0o644, 0o600, 0o755, 0o440]), min_size=len(TARGETS), max_size=len(TARGETS)),
)
def test_apply_revert_laws(tmp_path_factory, version, backend, worker_impl, consistency, modes) -> None:
    root = tmp_path_factory.mktemp("laws") / "tree"
    with zipfile.ZipFile(verl_wheel(version)) as zf:
        zf.extractall(root)
    for rel, mode in zip(TARGETS, modes):
        (root / rel).chmod(mode)
    original = snapshot(root)
    args = ["--verl-root", root, "--backend", backend, "--worker-impl", worker_impl]
    if consistency:
        args += ["--mode", "consistency"]
    try:
        code, first = cli_json("apply", *args)
        assert code == ExitCode.OK, first
        assert first["status"] == "applied" and first["files"]
        for rel in first["files"]:
            assert snapshot(root)[rel][1] == original[rel][1]  # modes kept by apply
        patched = snapshot(root)
        code, second = cli_json("apply", *args)  # apply∘apply = apply
        assert code == ExitCode.OK and second["status"] == "already applied" and snapshot(root) == patched
        code, verified = cli_json("verify", "--verl-root", root)  # includes git apply --check -R
        assert code == ExitCode.OK, [c for c in verified["trees"][0]["checks"] if not c["ok"]]
        assert any(c["check"].startswith("recorded diff reverse-applies") for c in verified["trees"][0]["checks"])
        assert cli_json("revert", "--verl-root", root)[0] == ExitCode.OK
        assert snapshot(root) == original  # revert∘apply = identity, bytes and modes
    finally:
        shutil.rmtree(root.parent, ignore_errors=True)
