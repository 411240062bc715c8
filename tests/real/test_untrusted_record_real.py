"""The record folder inside a tree is untrusted input: running rlprobe-patch on a tree never runs
code planted there (issue 13).

Each vector is planted into a real patched verl 0.9.1 tree, then every command runs as usual:
status, verify, verify --recheck, apply of another patch, revert (stopped by a real edit) and
revert --merge. A planted command would create a marker file; it never does. Each command
either refuses (exit 3) naming the planted key or file, or completes with the planted thing
inert. (The fast part: tests/cli/test_untrusted_record.py; the planted executables:
tests/planted_code.py.)
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import REPO, cli_json, snapshot
from planted_code import evil_hooks, run_isolated, script

from rlprobe_patch.base.errors import ExitCode

FSDP = "verl/workers/engine/fsdp/transformer_impl.py"


def add_config(git_dir: Path, text: str) -> None:
    with open(git_dir / "config", "a") as f:
        f.write(text)


# Each vector plants into (history.git, tree root, scratch folder, marker) and says what a refusal
# must name (None: the commands must complete, the planted thing inert).
Plant = Callable[[Path, Path, Path, Path], None]


def plant_hooks(git_dir: Path, root: Path, tmp: Path, marker: Path) -> None:
    evil_hooks(git_dir / "hooks", marker)


def plant_hooks_path(git_dir: Path, root: Path, tmp: Path, marker: Path) -> None:
    add_config(git_dir, f"[core]\n\thooksPath = {evil_hooks(tmp / 'evil-hooks', marker)}\n")


def plant_fsmonitor(git_dir: Path, root: Path, tmp: Path, marker: Path) -> None:
    add_config(git_dir, f"[core]\n\tfsmonitor = {script(tmp / 'fsmonitor', marker)}\n")


def plant_pager(git_dir: Path, root: Path, tmp: Path, marker: Path) -> None:
    pager = script(tmp / "pager", marker)
    add_config(git_dir, f"[core]\n\tpager = {pager}\n[pager]\n\tlog = {pager}\n\tdiff = {pager}\n")


def plant_alias(git_dir: Path, root: Path, tmp: Path, marker: Path) -> None:
    add_config(git_dir, f"[alias]\n\tupdate-refs = !{script(tmp / 'alias', marker)}\n")


def plant_filter(git_dir: Path, root: Path, tmp: Path, marker: Path) -> None:
    filt = script(tmp / "filter", marker)
    add_config(git_dir, f'[filter "evil"]\n\tclean = {filt}\n\tsmudge = {filt}\n\tprocess = {filt}\n')
    (git_dir / "info").mkdir(exist_ok=True)
    (git_dir / "info" / "attributes").write_text("* filter=evil diff=evil\n")
    (root / ".gitattributes").write_text("* filter=evil diff=evil\n")


def plant_textconv(git_dir: Path, root: Path, tmp: Path, marker: Path) -> None:
    add_config(git_dir, f'[diff "evil"]\n\ttextconv = {script(tmp / "textconv", marker)}\n')
    (root / ".gitattributes").write_text("* diff=evil\n")


def plant_ssh_command(git_dir: Path, root: Path, tmp: Path, marker: Path) -> None:
    add_config(git_dir, f"[core]\n\tsshCommand = {script(tmp / 'ssh', marker)}\n")


def plant_include(git_dir: Path, root: Path, tmp: Path, marker: Path) -> None:
    included = tmp / "evil.config"
    included.write_text(f"[core]\n\thooksPath = {evil_hooks(tmp / 'evil-hooks', marker)}\n")
    add_config(git_dir, f"[include]\n\tpath = {included}\n")


def plant_include_if(git_dir: Path, root: Path, tmp: Path, marker: Path) -> None:
    included = tmp / "evil.config"
    included.write_text(f"[core]\n\thooksPath = {evil_hooks(tmp / 'evil-hooks', marker)}\n")
    add_config(git_dir, f'[includeIf "gitdir:/"]\n\tpath = {included}\n')


def plant_diff_external(git_dir: Path, root: Path, tmp: Path, marker: Path) -> None:
    add_config(git_dir, f"[diff]\n\texternal = {script(tmp / 'external-diff', marker)}\n")


def plant_commondir(git_dir: Path, root: Path, tmp: Path, marker: Path) -> None:
    """`commondir` makes git take its config (and hooks) from another folder."""
    other = tmp / "other.git"
    subprocess.run(["git", "init", "-q", "--bare", str(other)], check=True)
    add_config(other, f"[core]\n\thooksPath = {evil_hooks(tmp / 'evil-hooks', marker)}\n")
    (git_dir / "commondir").write_text(f"{other}\n")


def plant_tree_repository(git_dir: Path, root: Path, tmp: Path, marker: Path) -> None:
    """The tree is itself a git checkout (a verl clone) with hooks, fsmonitor, filters: not our record."""
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    filt = script(tmp / "filter", marker)
    add_config(
        root / ".git",
        f"[core]\n\thooksPath = {evil_hooks(tmp / 'evil-hooks', marker)}\n\tfsmonitor = {filt}\n\tpager = {filt}\n"
        f'[filter "evil"]\n\tclean = {filt}\n\tsmudge = {filt}\n[diff "evil"]\n\ttextconv = {filt}\n'
        f"[diff]\n\texternal = {filt}\n",
    )
    (root / ".gitattributes").write_text("* filter=evil diff=evil\n")
    evil_hooks(root / ".git" / "hooks", marker)


VECTORS: dict[str, tuple[Plant, str | None]] = {
    "hooks": (plant_hooks, "hooks/reference-transaction"),
    "core.hooksPath": (plant_hooks_path, "core.hookspath"),
    "core.fsmonitor": (plant_fsmonitor, "core.fsmonitor"),
    "core.pager": (plant_pager, "core.pager"),
    "alias": (plant_alias, "alias.update-refs"),
    "filter": (plant_filter, "filter.evil.clean"),
    "diff.textconv": (plant_textconv, "diff.evil.textconv"),
    "core.sshCommand": (plant_ssh_command, "core.sshcommand"),
    "include.path": (plant_include, "include.path"),
    "includeIf": (plant_include_if, "includeif.gitdir:/.path"),
    "diff.external": (plant_diff_external, "diff.external"),
    "commondir": (plant_commondir, "commondir"),
    "tree is a git checkout": (plant_tree_repository, None),
}


def commands(root: Path) -> list[tuple[str, list[str], set[int]]]:
    """(name, argv, exit codes it has when nothing is refused)."""
    r = ["--verl-root", str(root)]
    return [
        ("status", ["status", *r], {ExitCode.OK}),
        ("verify", ["verify", *r], {ExitCode.OK}),
        ("verify --recheck", ["verify", *r, "--recheck"], {ExitCode.OK}),
        ("apply another patch", ["apply", *r, "--backend", "fsdp", "--only", "verl.debug-metrics"], {ExitCode.OK}),
        ("edit", [], set()),
        ("revert", ["revert", *r], {ExitCode.REVERT_BLOCKED}),
        ("revert --merge", ["revert", *r, "--merge"], {ExitCode.OK}),
    ]


@pytest.mark.parametrize("vector", list(VECTORS))
def test_planted_vector_never_runs(real_tree, tmp_path: Path, vector: str) -> None:
    root = real_tree("0.9.1")
    assert cli_json("apply", "--verl-root", root, "--backend", "fsdp")[0] == ExitCode.OK
    git_dir = root / ".rlprobe-patch" / "history.git"
    marker = tmp_path / "MARKER"
    plant, refusal = VECTORS[vector]
    plant(git_dir, root, tmp_path, marker)
    before = snapshot(root)
    for name, argv, expected in commands(root):
        if not argv:  # a real edit after apply, away from the hook: revert stops, revert --merge keeps it
            with open(root / FSDP, "a") as f:
                f.write("\n# my own edit after apply\n")
            before = snapshot(root)
            continue
        code, out = cli_json(*argv)
        assert not marker.exists(), f"{vector}: planted code ran during {name}: {marker.read_text()}"
        if refusal is None:
            assert code in expected, (name, out)
        else:
            assert code == ExitCode.REFUSED, (name, out)
            assert refusal in out["message"] + " ".join(out["details"]), (name, out)
            assert "--trust-record" not in out["hint"]  # content is refused whoever owns it
            assert snapshot(root) == before, f"{name} wrote to the tree"
    if refusal is None:
        text = (root / FSDP).read_text()
        assert "# my own edit after apply" in text and "rlprobe-patch" not in text


STRANGER = 4242  # a uid no account here has


def chown_all(path: Path, uid: int) -> None:
    for p in [path, *path.rglob("*")]:
        os.lchown(p, uid, uid)


def test_record_owned_by_another_user_needs_trust_record(real_tree) -> None:
    root = real_tree("0.9.1")
    original = snapshot(root)
    assert cli_json("apply", "--verl-root", root, "--backend", "fsdp")[0] == ExitCode.OK
    patched = snapshot(root)
    chown_all(root / ".rlprobe-patch", STRANGER)
    for argv in (["status"], ["verify"], ["verify", "--recheck"], ["revert"], ["revert", "--merge"]):
        code, out = cli_json(*argv, "--verl-root", root)
        assert code == ExitCode.REFUSED, (argv, out)
        assert f"is owned by uid {STRANGER}, not by you (uid 0) or root" in out["message"]
        assert "--trust-record" in out["hint"] and "safe.directory" in out["hint"]
    code, out = cli_json("apply", "--verl-root", root, "--backend", "fsdp", "--only", "verl.debug-metrics")
    assert code == ExitCode.REFUSED and "--trust-record" in out["hint"]
    assert snapshot(root) == patched
    # One file of another user's among ours is enough.
    chown_all(root / ".rlprobe-patch", 0)
    os.lchown(root / ".rlprobe-patch" / "history.git" / "HEAD", STRANGER, STRANGER)
    code, out = cli_json("verify", "--verl-root", root)
    assert code == ExitCode.REFUSED and "history.git/HEAD is owned by uid 4242" in out["message"]
    chown_all(root / ".rlprobe-patch", STRANGER)
    code, out = cli_json("verify", "--verl-root", root, "--trust-record")
    assert code == ExitCode.OK, out
    code, out = cli_json("revert", "--verl-root", root, "--trust-record")
    assert code == ExitCode.OK, out
    assert snapshot(root) == original


def test_symlinked_record_folder_or_journal_is_refused(real_tree, tmp_path: Path) -> None:
    root = real_tree("0.9.1")
    assert cli_json("apply", "--verl-root", root, "--backend", "fsdp")[0] == ExitCode.OK
    record = root / ".rlprobe-patch"
    patched = snapshot(root)
    # The whole record folder a link to one outside the tree.
    outside = tmp_path / "outside-record"
    record.rename(outside)
    record.symlink_to(outside)
    for argv in (["status"], ["verify"], ["revert"], ["apply", "--backend", "fsdp", "--only", "verl.debug-metrics"]):
        code, out = cli_json(*argv, "--verl-root", root)
        assert code == ExitCode.REFUSED, (argv, out)
        assert f"{record} is a symbolic link (to {outside})" in out["message"]
    assert snapshot(root) == patched
    record.unlink()
    outside.rename(record)
    # A journal (an interrupted write to finish) that is a link to a file outside the tree.
    journal = tmp_path / "journal.json"
    journal.write_text('{"op": "revert", "record": "x", "files": [], "ledger": {}, "branches": {}}')
    (record / "journal.json").symlink_to(journal)
    for argv in (["status"], ["verify"], ["revert"]):
        code, out = cli_json(*argv, "--verl-root", root)
        assert code == ExitCode.REFUSED, (argv, out)
        assert f"{record / 'journal.json'} is a symbolic link (to {journal})" in out["message"]
    assert snapshot(root) == patched and journal.exists()
    (record / "journal.json").unlink()
    # The lock file a link to a file of someone else's: never opened, never truncated.
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (record / "lock").unlink()
    (record / "lock").symlink_to(victim)
    code, out = cli_json("revert", "--verl-root", root)
    assert code == ExitCode.REFUSED and "lock is a symbolic link" in out["message"]
    assert victim.read_text() == "precious\n" and snapshot(root) == patched


def git_spy(folder: Path, log: Path) -> Path:
    """A `git` first on PATH that records its arguments, folder and environment, then runs the real one."""
    real = subprocess.run(["which", "git"], capture_output=True, text=True, check=True).stdout.strip()
    log.mkdir()
    spy = folder / "git"
    spy.write_text(
        "#!/bin/sh\n"
        f'f=$(mktemp "{log}/call.XXXXXX")\n'
        'printf "%s\\0" "$PWD" "$@" > "$f.args"\n'
        'env -0 > "$f.env"\n'
        f'exec {real} "$@"\n'
    )
    spy.chmod(0o755)
    return folder


def spied_calls(log: Path) -> list[tuple[list[str], dict[str, str]]]:
    calls = []
    for args in sorted(log.glob("*.args")):
        env = dict(item.split("=", 1) for item in args.with_suffix(".env").read_text().split("\0") if "=" in item)
        calls.append((args.read_text().split("\0")[1:-1], env))
    return calls


def test_every_git_call_is_isolated(real_tree, tmp_path: Path) -> None:
    """Every git process rlprobe-patch starts (our own and GitPython's) gets the isolated environment."""
    from rlprobe_patch.base.gitsafe import ISOLATION_CONFIG, ISOLATION_ENV

    root = real_tree("0.9.1")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls"
    env = {
        **os.environ,
        "PATH": f"{git_spy(bin_dir, log)}:{os.environ['PATH']}",
        "PYTHONPATH": str(REPO / "src"),
        "GIT_DIR": str(tmp_path / "not-this-one"),  # the caller's own git variables do not leak in
        "GIT_EXTERNAL_DIFF": "false",
    }
    r = ["--verl-root", str(root)]
    runs = [
        (["apply", *r, "--backend", "fsdp", "--dry-run"], 0),
        (["apply", *r, "--backend", "fsdp"], 0),
        (["status", *r], 0),
        (["verify", *r, "--recheck"], 0),
        (["apply", *r, "--backend", "fsdp", "--only", "verl.debug-metrics"], 0),
        (["revert", *r], ExitCode.REVERT_BLOCKED),
        (["revert", *r, "--merge"], 0),
    ]
    for argv, expected in runs:
        if argv[0] == "revert" and "--merge" not in argv:
            with open(root / FSDP, "a") as f:
                f.write("\n# my own edit after apply\n")
        if "--merge" in argv:
            # rlprobe-patch reads the loose objects it writes itself; objects git packed are read
            # through GitPython (its `cat-file`): pack them, so that the last revert reads them so.
            history = root / ".rlprobe-patch" / "history.git"
            subprocess.run(["git", "--git-dir", str(history), "repack", "-a", "-d", "-q"], check=True)
            assert not list((history / "objects").glob("??/*"))
        proc = run_isolated(*argv, env=env)
        assert proc.returncode == expected, (argv, proc.stderr)
    calls = spied_calls(log)
    commands = {args[0] for args, _ in calls}
    # Our own subprocesses and GitPython's: init, packed blobs read by cat-file, refs, diffs, merges, config checks.
    assert {"init", "cat-file", "update-ref", "rev-parse", "diff", "apply", "merge-file", "config"} <= commands
    isolated = {f"GIT_CONFIG_KEY_{i}": k for i, k in enumerate(ISOLATION_CONFIG)}
    isolated |= {f"GIT_CONFIG_VALUE_{i}": v for i, v in enumerate(ISOLATION_CONFIG.values())}
    isolated |= {**ISOLATION_ENV, "GIT_CONFIG_COUNT": str(len(ISOLATION_CONFIG))}
    for args, git_env in calls:
        if args == ["version"]:
            continue  # GitPython's check, at import, that git runs: no repository, no configuration read
        assert {k: git_env.get(k) for k in isolated} == isolated, args
        assert git_env["GIT_DIR"] in (os.devnull, str(root / ".rlprobe-patch" / "history.git")), args
        if args[0] in ("diff", "apply", "merge-file", "config"):  # ours: the caller's GIT_* are dropped too
            assert "GIT_EXTERNAL_DIFF" not in git_env, args
