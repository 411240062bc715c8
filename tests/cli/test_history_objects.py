"""history.git as git reads it: the objects rlprobe-patch writes without git, and one `git diff` for all files.

rlprobe-patch writes blobs, trees and commits as loose objects through gitdb's LooseObjectDB
(GitPython's object database) instead of a `git hash-object` per object. git itself must read
them back as they are meant: `git fsck --strict` finds nothing, the record's commits hold
exactly the ledger's files (path, mode, blob), the blobs hold the bytes whose sha256 the ledger
names, and objects git packed later are still read. A damaged loose object reads as an I/O error.
`unified_diff` runs one `git diff --no-index` of two folders: its text must be what one
`git diff` per file gives (the way it was made before), for changed, added, removed and
unchanged files, paths with spaces and folders that sort differently from their files.
The trees are our fixture stand-ins (fixtures/verl-0.9), not verl's code.
"""

from __future__ import annotations

import errno
import json
import subprocess
import zlib
from pathlib import Path

import pytest
from conftest import cli_json

from rlprobe_patch.base.diffs import unified_diff
from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.base.fsio import sha256
from rlprobe_patch.base.gitsafe import run_git
from rlprobe_patch.record.folder import RecordFolder


def git(history: Path, *args: str) -> str:
    proc = subprocess.run(["git", "--git-dir", str(history), *args], capture_output=True, text=True)
    assert proc.returncode == 0, (args, proc.stderr)
    return proc.stdout


def test_git_reads_the_objects_we_write(fixture_tree) -> None:
    root = fixture_tree("0.9")
    assert cli_json("apply", "--verl-root", root, "--backend", "fsdp")[0] == ExitCode.OK
    assert cli_json("apply", "--verl-root", root, "--backend", "megatron")[0] == ExitCode.OK  # a second record
    history = root / ".rlprobe-patch" / "history.git"
    assert "error" not in git(history, "fsck", "--strict", "--no-dangling").lower()
    ledger = json.loads((root / ".rlprobe-patch" / "ledger.json").read_text())
    assert len(ledger["records"]) == 2
    for record in ledger["records"]:
        for commit, side in ((record["commit_after"], "after"), (record["commit_before"], "before")):
            listed = {}
            for line in git(history, "ls-tree", "-r", commit).splitlines():
                meta, path = line.split("\t")
                mode, kind, blob = meta.split()
                assert kind == "blob"
                listed[path] = (mode, blob)
            want = {
                f["path"]: ("100755" if f["mode"] & 0o111 else "100644", f[f"{side}_blob"])
                for f in record["files"]
                if f[side]
            }
            assert listed == want
        for f in record["files"]:
            data = subprocess.run(
                ["git", "--git-dir", str(history), "cat-file", "blob", f["after_blob"]], capture_output=True, check=True
            ).stdout
            assert sha256(data) == f["after"] == sha256((root / f["path"]).read_bytes())
    # The second record's "before" commit follows the first record's "after" on the branch.
    first, second = ledger["records"]
    assert git(history, "rev-parse", f"{second['commit_before']}^").strip() == first["commit_after"]
    assert git(history, "rev-parse", "refs/heads/verl").strip() == second["commit_after"]

    # Packed by git (gc, repack): still read, through GitPython; verify and revert work.
    git(history, "repack", "-a", "-d", "-q")
    assert not list((history / "objects").glob("??/*"))
    state = RecordFolder(root)
    blob = second["files"][0]["after_blob"]
    assert sha256(state.history.read_blob(blob)) == second["files"][0]["after"]
    assert cli_json("verify", "--verl-root", root)[0] == ExitCode.OK
    assert cli_json("revert", "--verl-root", root)[0] == ExitCode.OK


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"not zlib at all",
        zlib.compress(b"blob 99\0short"),
        zlib.compress(b"tree 3\0abc"),
        zlib.compress(b"no header"),
    ],
    ids=["empty", "not-zlib", "short", "not-a-blob", "no-header"],
)
def test_a_damaged_loose_object_reads_as_an_io_error(fixture_tree, content: bytes) -> None:
    root = fixture_tree("0.9")
    assert cli_json("apply", "--verl-root", root, "--backend", "fsdp")[0] == ExitCode.OK
    ledger = json.loads((root / ".rlprobe-patch" / "ledger.json").read_text())
    blob = ledger["records"][0]["files"][0]["after_blob"]
    path = root / ".rlprobe-patch" / "history.git" / "objects" / blob[:2] / blob[2:]
    path.chmod(0o644)
    path.write_bytes(content)
    with pytest.raises(OSError) as raised:
        RecordFolder(root).history.read_blob(blob)
    assert raised.value.errno == errno.EIO and blob in str(raised.value)
    with pytest.raises(ValueError, match="not a blob id"):
        RecordFolder(root).history.read_blob("../" + blob[3:])


def test_one_git_diff_gives_the_per_file_text(tmp_path: Path) -> None:
    changes: dict[str, tuple[bytes | None, bytes | None]] = {
        "verl/a.py": (b"a = 1\nb = 2\n", b"a = 1\nb = 3\n"),
        "verl/a/b.py": (b"x = 1\n", None),  # removed; its folder sorts after verl/a.py
        "verl/new/added.py": (None, b"y = 2\n"),
        "verl/same.py": (b"same\n", b"same\n"),
        "verl/sp ace.py": (b"1\n", b"2\n"),
        "verl/no_newline.py": (b"q = 1", b"q = 2"),
    }
    expected = []
    for i, (path, (before, after)) in enumerate(sorted(changes.items())):
        sides = []
        for side, data in (("a", before), ("b", after)):
            if data is None:
                sides.append("/dev/null")
                continue
            target = tmp_path / str(i) / side / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            sides.append(f"{side}/{path}")
        proc = run_git(["diff", "--no-index", "--no-prefix", "--no-color", *sides], cwd=tmp_path / str(i))
        text = proc.stdout.decode()
        first, _, rest = text.partition("\n")
        expected.append(f"diff --git a/{path} b/{path}\n{rest}" if first.startswith("diff --git ") else text)
    got = unified_diff(changes)
    assert got == "".join(expected)
    assert got.count("diff --git ") == 5  # the unchanged file has no section
