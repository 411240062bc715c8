"""core/sites.py: the files a plan reads (`Workspace`, `parse_target`) and one site's state.

On our fixture tree of verl 0.9 and the real catalogue's `verl.fsdp-engine` patch: every
refusal `parse_target` owes (link, missing, not UTF-8, not Python), each file read and parsed
once, partial parsing held to what the caller declared, and the three states of a site.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlprobe_patch.base.errors import RefusedError
from rlprobe_patch.catalogue.patches import get_patch
from rlprobe_patch.catalogue.trees import Tree, find_tree
from rlprobe_patch.codemod import CreateFile, Scope, State
from rlprobe_patch.core.sites import Workspace, parse_target, scopes_of, site_present, site_state
from rlprobe_patch.record.folder import checked_key

FSDP = "verl/workers/engine/fsdp/transformer_impl.py"


@pytest.fixture
def tree(fixture_tree) -> Tree:
    return find_tree("verl", fixture_tree("0.9"))


def fsdp_site(tree: Tree):
    patch = get_patch("verl.fsdp-engine")
    (site,) = patch.sites_for(tree.version)
    assert site.target == FSDP
    return patch, site


def test_parse_target_reads_the_tree_and_refuses_what_it_must_not_patch(tree: Tree) -> None:
    data, module, partial = parse_target(tree, FSDP)
    assert data == (tree.root / FSDP).read_bytes() and module.code.encode() == data and partial is None
    with pytest.raises(RefusedError, match="missing"):
        parse_target(tree, "verl/workers/engine/fsdp/nothing_here.py")
    path = tree.root / FSDP
    path.write_bytes(b"x = '\xff'\n")
    with pytest.raises(RefusedError, match=r"not UTF-8 \(invalid start byte at byte 5\)"):
        parse_target(tree, FSDP)
    path.write_text("def f(:\n")
    with pytest.raises(RefusedError, match=rf"{FSDP}:1:\d+: syntax error, cannot patch it"):
        parse_target(tree, FSDP)


def test_parse_target_refuses_a_file_reached_through_a_link(tree: Tree, tmp_path: Path) -> None:
    real = tmp_path / "elsewhere"
    os.rename(tree.root / "verl/workers/engine/fsdp", real)
    os.symlink(real, tree.root / "verl/workers/engine/fsdp")
    with pytest.raises(RefusedError, match="reached through a symbolic link"):
        parse_target(tree, FSDP)


def test_given_bytes_are_parsed_instead_of_the_disk(tree: Tree) -> None:
    data, module, _ = parse_target(tree, FSDP, b"x = 1\n")
    assert data == b"x = 1\n" and module.code == "x = 1\n"


def test_workspace_reads_each_file_once_and_parses_only_the_scope(tree: Tree) -> None:
    patch, site = fsdp_site(tree)
    codemod = patch.codemod(site)
    scopes = scopes_of([(patch, site)])
    assert set(scopes) == {FSDP} and scopes[FSDP] == codemod.scope()
    ws = Workspace(tree, scopes=scopes)
    first = ws.file(FSDP)
    assert ws.file(FSDP) is first and first.disk == first.base == (tree.root / FSDP).read_bytes()
    module = ws.module(FSDP, codemod.scope())
    assert ws.module(FSDP, codemod.scope()) is module  # parsed once
    assert first.partial is not None and len(module.code) < len(first.base or b"")  # only what the codemod reads
    assert first.partial.splice(module.code).encode() == first.base  # the rest comes back byte for byte
    with pytest.raises(RuntimeError, match="parsed for"):
        ws.module(FSDP)  # a caller reading the whole file must have said so


def test_workspace_starts_from_given_bases(tree: Tree) -> None:
    ws = Workspace(tree, bases={FSDP: (b"x = 1\n", 0o600), "verl/absent.py": (None, 0o644)})
    f = ws.file(FSDP)
    assert f.base == b"x = 1\n" and f.mode == 0o600 and f.disk == (tree.root / FSDP).read_bytes()
    assert ws.module(FSDP).code == "x = 1\n"
    with pytest.raises(RefusedError, match="missing"):
        ws.module("verl/absent.py")


def test_site_state_applicable_applied_drifted(tree: Tree) -> None:
    patch, site = fsdp_site(tree)
    codemod = patch.codemod(site)
    assert not isinstance(codemod, CreateFile)
    found = site_state(Workspace(tree, scopes=scopes_of([(patch, site)])), patch, site)
    assert found.state is State.APPLICABLE and found.expected is not None and not found.remembered
    original = (tree.root / FSDP).read_bytes()
    assert found.key == checked_key(patch.id, FSDP, patch.fingerprint, original)

    (tree.root / FSDP).write_text(found.expected.code)  # the patch as the site wants it
    applied = site_state(Workspace(tree), patch, site)
    assert applied.state is State.APPLIED and not applied.reasons

    known = {applied.key}  # verify's memo: these bytes were found APPLIED before
    again = site_state(Workspace(tree), patch, site, known)
    assert again.state is State.APPLIED and again.remembered and again.expected is None

    (tree.root / FSDP).write_bytes(original.replace(b"def forward_backward_batch", b"def renamed_batch"))
    drifted = site_state(Workspace(tree), patch, site)
    assert drifted.state is State.DRIFTED and drifted.reasons


def test_a_broken_file_is_a_drifted_site_that_says_why(tree: Tree) -> None:
    patch, site = fsdp_site(tree)
    (tree.root / FSDP).write_text("def f(:\n")
    found = site_state(Workspace(tree), patch, site)
    assert found.state is State.DRIFTED
    (reason,) = found.reasons
    assert reason.startswith(f"{tree.root / FSDP}:1:") and reason.endswith(
        ": syntax error, cannot patch it (the file is broken; reinstall the package)"
    )


def test_an_optional_site_is_present_only_with_its_file(tree: Tree) -> None:
    optional = [
        (p, s)
        for p in [get_patch(i) for i in ("verl.fsdp-engine", "verl.request-id", "verl.prompts-only")]
        for s in p.sites
        if not s.required
    ]
    required = [s for p in [get_patch("verl.fsdp-engine")] for s in p.sites if s.required]
    assert all(site_present(tree, s) for s in required)
    for _, site in optional:
        assert site_present(tree, site) == (tree.root / site.target).is_file()


def test_scopes_of_unites_what_every_codemod_of_a_file_reads(tree: Tree) -> None:
    sites = [
        (p, s) for p in [get_patch("verl.fsdp-engine"), get_patch("verl.request-id")] for s in p.sites_for(tree.version)
    ]
    scopes = scopes_of(sites)
    for patch, site in sites:
        codemod = patch.codemod(site)
        if not isinstance(codemod, CreateFile):
            assert scopes[site.target].covers(codemod.scope())
    assert all(isinstance(s, Scope) for s in scopes.values())
