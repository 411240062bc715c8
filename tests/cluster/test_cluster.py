"""`rlprobe-patch cluster ...` on a real multi-node Ray cluster on this machine.

`ray.cluster_utils.Cluster` starts a head and two worker nodes (one CPU each, a small object
store), each with its own folder named by the node-local variable `RLPROBE_NODE_DIR` (and its
own registry, `RLPROBE_PATCH_STATE_HOME`): the commands are given `--verl-root
'$RLPROBE_NODE_DIR/tree'`, which each node expands in its own environment, so every node
patches its own tree. Nodes with a fault, without rlprobe-patch, or joining later are added
per test. The command runs as a separate driver process, as a user would run it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURES, SLIME_MODEL, changed_catalogue, snapshot

from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.catalogue.patches import get_patch
from rlprobe_patch.catalogue.releases import CATALOGUE_ENV

ray = pytest.importorskip("ray", reason="ray is not installed: pip install 'rlprobe-patch[ray]' (in the test extra)")
from ray.cluster_utils import Cluster  # noqa: E402

ROOT = "$RLPROBE_NODE_DIR/tree"
FSDP = "verl/workers/engine/fsdp/transformer_impl.py"
NODE_ARGS = {"num_cpus": 1, "object_store_memory": 80 * 1024**2}


class RayCluster:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.dirs: dict[str, Path] = {}
        self.cluster = Cluster(
            initialize_head=True,
            head_node_args={**NODE_ARGS, "include_dashboard": False, "env_vars": self.env("head")},
        )
        self.workers = {name: self.add(name) for name in ("b", "c")}

    def env(self, name: str, **extra: str) -> dict[str, str]:
        folder = self.dirs.setdefault(name, self.base / name)
        folder.mkdir(parents=True, exist_ok=True)
        return {"RLPROBE_NODE_DIR": str(folder), "RLPROBE_PATCH_STATE_HOME": str(folder / "state"), **extra}

    def add(self, name: str, folder: str | None = None, **extra: str) -> Any:
        env = self.env(folder or name, **extra)
        return self.cluster.add_node(**NODE_ARGS, env_vars=env)

    def remove(self, node: Any, graceful: bool = True) -> None:
        self.cluster.remove_node(node, allow_graceful=graceful)

    def tree(self, name: str) -> Path:
        return self.dirs[name] / "tree"

    def reset(self, names: tuple[str, ...] = ("head", "b", "c"), **releases: str) -> dict[str, dict]:
        """A fresh fixture tree per node (verl-0.9 unless named); their snapshots."""
        for name in self.dirs:
            shutil.rmtree(self.dirs[name] / "tree", ignore_errors=True)
            shutil.rmtree(self.dirs[name] / "state", ignore_errors=True)
        for name in names:
            shutil.copytree(FIXTURES / f"verl-{releases.get(name, '0.9')}", self.tree(name))
        return {name: snapshot(self.tree(name)) for name in names}

    def run(self, *args: str, as_json: bool = True) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RLPROBE_PATCH_FAULT")}
        command = [sys.executable, "-m", "rlprobe_patch", "cluster", *args, "--address", self.cluster.address]
        return subprocess.run(
            command + (["--json"] if as_json else []), capture_output=True, text=True, env=env, timeout=300
        )

    def cli(self, *args: str) -> tuple[int, dict]:
        done = self.run(*args)
        assert done.stdout.strip(), done.stderr
        return done.returncode, json.loads(done.stdout)


@pytest.fixture(scope="module")
def rc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    c = RayCluster(tmp_path_factory.mktemp("ray-nodes"))
    yield c
    c.cluster.shutdown()


def by_node(doc: dict) -> dict[str, dict]:
    """The report of each node, keyed by its folder name (from the tree root it patched)."""
    return {Path(n["trees"][0]["root"]).parent.name: n for n in doc["nodes"] if n["trees"]}


def unchanged(rc: RayCluster, before: dict[str, dict]) -> None:
    for name, snap in before.items():
        assert snapshot(rc.tree(name)) == snap, f"node {name}: tree changed"
        assert not (rc.tree(name) / ".rlprobe-patch" / "journal.json").exists(), name


def test_apply_verify_status_revert_on_every_node(rc: RayCluster) -> None:
    before = rc.reset()
    code, doc = rc.cli("apply", "--verl-root", ROOT, "--backend", "fsdp")
    assert code == ExitCode.OK, doc
    nodes = by_node(doc)
    assert sorted(nodes) == ["b", "c", "head"] and len({n["node_id"] for n in doc["nodes"]}) == 3
    for name, node in nodes.items():
        tree = node["trees"][0]
        assert node["result"] == "applied" and tree["version"] == "0.9.1" and tree["records"], node
        assert tree["root"] == str(rc.tree(name))  # each node patched its own tree
        assert snapshot(rc.tree(name))[FSDP] != before[name][FSDP]
    assert len({n["trees"][0]["target"] for n in doc["nodes"]}) == 1
    code, doc = rc.cli("verify", "--verl-root", ROOT)
    assert code == ExitCode.OK and {n["result"] for n in doc["nodes"]} == {"verified"}, doc
    done = rc.run("status", "--verl-root", ROOT, as_json=False)
    assert done.returncode == ExitCode.OK, done.stderr
    assert "all 3 node(s) agree" in done.stdout and "applied: verl.fsdp-engine" in done.stdout
    for node in doc["nodes"]:
        assert node["node_id"][:8] in done.stdout

    # A node that joins later is named by status; apply again patches it alone.
    late = rc.add("late")
    try:
        shutil.copytree(FIXTURES / "verl-0.9", rc.tree("late"))
        original_late = snapshot(rc.tree("late"))
        code, doc = rc.cli("status", "--verl-root", ROOT)
        assert code == ExitCode.NODES_DISAGREE, doc
        nodes = by_node(doc)
        assert nodes["late"]["result"] == "differs" and "joined after" in " ".join(nodes["late"]["reasons"])
        assert {nodes[n]["result"] for n in ("head", "b", "c")} == {"agrees"}
        code, doc = rc.cli("apply", "--verl-root", ROOT, "--backend", "fsdp")
        assert code == ExitCode.OK, doc
        nodes = by_node(doc)
        assert nodes["late"]["result"] == "applied"
        assert {nodes[n]["result"] for n in ("head", "b", "c")} == {"already applied"}
        assert len({n["trees"][0]["target"] for n in doc["nodes"]}) == 1  # the same patched tree everywhere
        code, doc = rc.cli("revert", "--verl-root", ROOT)
        assert code == ExitCode.OK and all(n["result"].startswith("reverted ") for n in doc["nodes"]), doc
        unchanged(rc, {**before, "late": original_late})
    finally:
        rc.remove(late)


@pytest.mark.parametrize(
    ("odd", "why"),
    [
        ("release", "verl 0.8.0 here; elsewhere: verl 0.9.1"),
        # the other disagreements: the exhaustive leg's (issue 35: each costs a cluster's apply, ~25 s)
        pytest.param("drift", "the patched tree would differ", marks=pytest.mark.exhaustive),
        pytest.param("missing", "no verl tree here", marks=pytest.mark.exhaustive),
        pytest.param(
            "patched",
            "verl carries records of verl.fsdp-engine here; of no patch elsewhere",
            marks=pytest.mark.exhaustive,
        ),
        pytest.param(
            "outdated",
            "verl carries records of verl.fsdp-engine here; of no patch elsewhere",
            marks=pytest.mark.exhaustive,
        ),
    ],
)
def test_nodes_that_disagree_write_nothing(rc: RayCluster, odd: str, why: str, tmp_path: Path) -> None:
    before = rc.reset(**({"c": "0.8"} if odd == "release" else {}))
    if odd == "drift":  # edited by hand on one node
        target = rc.tree("c") / FSDP
        target.write_text(target.read_text().replace("self.", "self .", 1))
    elif odd == "missing":
        shutil.rmtree(rc.tree("c") / "verl")
    elif odd == "patched":  # the FSDP hook applied there by hand; the cluster asked for the Megatron one
        env = {**os.environ, "RLPROBE_PATCH_STATE_HOME": str(rc.dirs["c"] / "state")}
        local = [sys.executable, "-m", "rlprobe_patch", "apply", "--verl-root", str(rc.tree("c")), "--backend", "fsdp"]
        assert subprocess.run(local, env=env, capture_output=True).returncode == 0
    elif odd == "outdated":  # the FSDP hook applied there at an older revision
        apply_older_revision(rc, "c", older_catalogue(tmp_path))
    before = {name: snapshot(rc.tree(name)) for name in before}
    code, doc = rc.cli("apply", "--verl-root", ROOT, "--backend", "megatron" if odd == "patched" else "fsdp")
    assert code == ExitCode.REFUSED, doc
    assert "nothing was written on any node" in doc["verdict"]
    results = {n["node_id"]: n for n in doc["nodes"]}
    odd_nodes = [n for n in results.values() if n["result"] in ("differs", "refused")]
    assert len(odd_nodes) == 1, doc
    assert why in " ".join(odd_nodes[0]["reasons"]), odd_nodes[0]["reasons"]
    unchanged(rc, before)
    for name in ("head", "b"):
        assert not (rc.tree(name) / ".rlprobe-patch" / "ledger.json").exists()


def older_catalogue(tmp_path: Path) -> Path:
    """A copy of the catalogue where verl.fsdp-engine is at revision 1, with another payload."""
    return changed_catalogue(tmp_path / "catalogue-r1", "verl.fsdp-engine", 1)


def apply_older_revision(rc: RayCluster, name: str, older: Path) -> None:
    """The FSDP hook applied on node `name`'s tree by an rlprobe-patch whose catalogue is `older`."""
    env = {**os.environ, "RLPROBE_PATCH_STATE_HOME": str(rc.dirs[name] / "state"), CATALOGUE_ENV: str(older)}
    local = [sys.executable, "-m", "rlprobe_patch", "apply", "--verl-root", str(rc.tree(name)), "--backend", "fsdp"]
    assert subprocess.run(local, env=env, capture_output=True).returncode == 0


# the exhaustive leg's (issue 35): the slice keeps one failure case, a node's write rolled back
@pytest.mark.exhaustive
def test_an_upgrade_failing_on_one_node_is_undone_on_every_node(rc: RayCluster, tmp_path: Path) -> None:
    """Every node holds the FSDP hook at r1; the cluster upgrades it to the current revision, one
    node is killed mid-write: every node goes back to r1 exactly (files and record), then the
    upgrade without the fault lands everywhere."""
    names = ("head", "b", "c", "faulty")
    node = rc.add("faulty", RLPROBE_PATCH_FAULT_APPLY="kill-at=5")
    try:
        rc.reset(names)
        older = older_catalogue(tmp_path)
        for name in names:
            apply_older_revision(rc, name, older)
        ledgers = {name: rc.dirs[name] / "tree" / ".rlprobe-patch" / "ledger.json" for name in names}
        before = {name: (snapshot(rc.tree(name)), ledgers[name].read_text()) for name in names}
        code, doc = rc.cli("apply", "--verl-root", ROOT, "--backend", "fsdp")
        assert code == ExitCode.WRITE_FAILED, doc
        nodes = by_node(doc)
        assert nodes["faulty"]["result"] == "write failed; rolled back", nodes["faulty"]
        assert {nodes[n]["result"] for n in ("head", "b", "c")} == {"applied; rolled back"}, doc
        assert "every reachable tree as before" in doc["verdict"]
        assert all("rolled back: undid " in " ".join(nodes[n]["reasons"]) for n in names), doc
        for name in names:  # at r1 again: the same files, the same record
            assert (snapshot(rc.tree(name)), ledgers[name].read_text()) == before[name], name
    finally:
        rc.remove(node)
    code, doc = rc.cli("apply", "--verl-root", ROOT, "--backend", "fsdp")
    assert code == ExitCode.OK and {n["result"] for n in doc["nodes"]} == {"applied"}, doc
    revision = get_patch("verl.fsdp-engine").revision
    for name in ("head", "b", "c"):
        (record,) = json.loads(ledgers[name].read_text())["records"]
        assert [(p["id"], p["revision"]) for p in record["patches"]] == [("verl.fsdp-engine", revision)]


@pytest.mark.parametrize(
    "fault",
    # a kill, and a full disk at the first write: the exhaustive leg's (issue 35)
    [
        "enospc-at=5",
        pytest.param("kill-at=5", marks=pytest.mark.exhaustive),
        pytest.param("enospc-at=1", marks=pytest.mark.exhaustive),
    ],
)
def test_a_node_failing_its_write_rolls_back_the_others(rc: RayCluster, fault: str) -> None:
    node = rc.add("faulty", RLPROBE_PATCH_FAULT_APPLY=fault)
    try:
        before = rc.reset(("head", "b", "c", "faulty"))
        code, doc = rc.cli("apply", "--verl-root", ROOT, "--backend", "fsdp")
        assert code == ExitCode.WRITE_FAILED, doc
        nodes = by_node(doc)
        assert nodes["faulty"]["result"] == "write failed; rolled back", nodes["faulty"]
        assert {nodes[n]["result"] for n in ("head", "b", "c")} == {"applied; rolled back"}
        assert "every reachable tree as before" in doc["verdict"]
        unchanged(rc, before)  # every tree byte-identical, the failed node's too
        code, doc = rc.cli("status", "--verl-root", ROOT)
        assert code == ExitCode.OK and {n["result"] for n in doc["nodes"]} == {"agrees"}, doc
    finally:
        rc.remove(node)


@pytest.mark.exhaustive  # as above
def test_a_node_killed_mid_apply_is_repaired_by_the_next_apply(rc: RayCluster) -> None:
    node = rc.add("lost", RLPROBE_PATCH_FAULT_APPLY="delay=1.0")
    rejoined = None
    try:
        before = rc.reset(("head", "b", "c", "lost"))
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        run = [sys.executable, "-m", "rlprobe_patch", "cluster", "apply", "--address", rc.cluster.address]
        proc = subprocess.Popen(
            [*run, "--verl-root", ROOT, "--backend", "fsdp", "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        journal = rc.tree("lost") / ".rlprobe-patch" / "journal.json"
        deadline = time.monotonic() + 120
        while not journal.exists():  # the node is inside its write phase
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        rc.remove(node, graceful=False)  # the machine is gone
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == ExitCode.WRITE_FAILED, stderr
        nodes = by_node(json.loads(stdout))
        assert nodes["lost"]["result"] == "LOST", nodes["lost"]
        assert "the next `rlprobe-patch cluster apply`" in " ".join(nodes["lost"]["reasons"])
        assert {nodes[n]["result"] for n in ("head", "b", "c")} == {"applied; rolled back"}
        unchanged(rc, {k: v for k, v in before.items() if k != "lost"})
        time.sleep(3)  # the local command died with its node: the journal stays
        assert journal.exists()

        rc.cluster.wait_for_nodes(timeout=120)  # Ray has marked the lost node dead
        rejoined = rc.add("again", folder="lost")  # the node comes back (same disk)
        code, doc = rc.cli("apply", "--verl-root", ROOT, "--backend", "fsdp")
        assert code == ExitCode.OK, doc
        nodes = by_node(doc)
        assert "recovered an interrupted write" in " ".join(nodes["lost"]["reasons"]), nodes["lost"]
        assert not journal.exists()
        assert {n["result"] for n in doc["nodes"]} <= {"applied", "already applied"}
        code, doc = rc.cli("verify", "--verl-root", ROOT)
        assert code == ExitCode.OK, doc
        code, doc = rc.cli("revert", "--verl-root", ROOT)
        assert code == ExitCode.OK, doc
        unchanged(rc, before)
    finally:
        for n in (node, rejoined):
            if n is not None and n in rc.cluster.worker_nodes:
                rc.remove(n)


def test_a_node_without_rlprobe_patch_is_named_and_nothing_is_touched(rc: RayCluster, tmp_path: Path) -> None:
    shadow = tmp_path / "shadow" / "rlprobe_patch"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('not installed on this node')\n")
    node = rc.add("bare", PYTHONPATH=str(shadow.parent))
    try:
        before = rc.reset(("head", "b", "c", "bare"))
        code, doc = rc.cli("apply", "--verl-root", ROOT, "--backend", "fsdp")
        assert code == ExitCode.REFUSED, doc
        assert "not importable on 1 node(s)" in doc["message"] and "-m pip install rlprobe-patch" in doc["hint"]
        assert len(doc["details"]) == 1 and node.node_id in doc["details"][0]
        unchanged(rc, before)
    finally:
        rc.remove(node)


def test_slime_root_reaches_every_node(rc: RayCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--slime-root` is one of the tree options every command takes: each node gets it (it was dropped)."""
    from script_oracle import SHARED

    from rlprobe_patch.catalogue import wheels
    from rlprobe_patch.catalogue.releases import releases

    monkeypatch.setenv("RLPROBE_UPSTREAM", str(SHARED / "upstream"))
    version = releases("slime").tested[-1]
    archive = wheels.fetch_release("slime", version)
    rc.reset()
    for name in ("head", "b", "c"):
        wheels.unpack_release(archive, rc.dirs[name] / "slime", "slime")
    code, doc = rc.cli("apply", "--slime-root", "$RLPROBE_NODE_DIR/slime", "--dry-run")
    assert code == ExitCode.OK, doc
    assert len(doc["nodes"]) == 3
    for node in doc["nodes"]:
        (tree,) = node["trees"]
        assert tree["package"] == "slime" and tree["version"] == version, node
        assert Path(tree["root"]).name == "slime" and not (Path(tree["root"]) / ".rlprobe-patch").exists()
    assert all(SLIME_MODEL in json.dumps(node) for node in doc["nodes"]), doc
