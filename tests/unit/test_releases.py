"""The release data (`patches/releases/<package>.toml`) and its loader, `rlprobe_patch.catalogue.releases`.

The only tests that name release numbers of the engine's cut-offs: they pin what the data
says, so that a data edit that changes behaviour shows up here."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO
from packaging.version import Version

from rlprobe_patch import matrix
from rlprobe_patch.catalogue import patches as catalogue
from rlprobe_patch.catalogue import releases as releases_module
from rlprobe_patch.catalogue.patches import load_catalogue
from rlprobe_patch.catalogue.releases import PACKAGE_FILES, releases
from rlprobe_patch.catalogue.trees import Tree
from rlprobe_patch.core.rules import resolve_worker_impl

PACKAGES = tuple(PACKAGE_FILES)


def verl_tree(version: str) -> Tree:
    return Tree("verl", Path("/nowhere"), Version(version), "version file")


@pytest.mark.parametrize(
    ("version", "impl"),
    [("0.6.0", "legacy"), ("0.6.1", "legacy"), ("0.7.0", "legacy"), ("0.7.1", "legacy"), ("0.8.0", "engine")],
)
def test_worker_path_without_a_script(version: str, impl: str) -> None:
    assert resolve_worker_impl(verl_tree(version), "auto")[0] == impl
    assert resolve_worker_impl(verl_tree(version), "engine") == ("engine", "--worker-impl engine")


def test_worker_path_on_0_7_follows_the_run() -> None:
    facts = {"use_legacy_worker_impl": ("disable", "run.sh:3")}
    impl, why = resolve_worker_impl(verl_tree("0.7.1"), "auto", Path("run.sh"), facts)
    assert impl == "engine" and "trainer.use_legacy_worker_impl=disable (run.sh:3)" in why
    facts = {"use_legacy_worker_impl": ("auto", "verl default (ppo_trainer.yaml)")}
    assert resolve_worker_impl(verl_tree("0.7.0"), "auto", Path("run.sh"), facts)[0] == "legacy"
    # From 0.8.0 the setting is moot: the legacy workers are gone.
    assert resolve_worker_impl(verl_tree("0.8.0"), "auto", Path("run.sh"), {})[0] == "engine"


@pytest.mark.parametrize("version", ["0.1", "0.6.0", "0.7.0", "0.7.1", "0.8.0", "0.10.0.dev0", "1.0"])
def test_every_verl_release_has_one_worker_path(version: str) -> None:
    data = releases("verl")
    assert sum(w.versions.contains(Version(version), prereleases=True) for w in data.worker_paths) == 1


def test_sglang_native_cutoff_meets_the_patch_range() -> None:
    """The model-runner patch ends where SGLang's own msprobe support starts: no gap, no overlap."""
    patch = catalogue.get_patch("sglang.model-runner")
    assert str(releases("sglang").native) == ">=0.5.11"
    assert patch.native == releases("sglang").native
    for release in ("0.5.10.post1", "0.5.11", "0.5.23"):
        version = Version(release)
        assert patch.supports(version) != patch.is_native(version), release


def test_checker_fail_lines_name_patches_of_the_catalogue() -> None:
    ids = {p.id for p in load_catalogue()}
    for package in PACKAGES:
        assert {pid for pid, _ in releases(package).checker_fails} <= ids
    assert releases("verl").expected_checker_fails("verl.request-id")


@pytest.mark.parametrize("package", PACKAGES)
def test_release_rows_are_consistent_with_the_catalogue(package: str) -> None:
    """A tested release is taken by some patch (applied or native); a refused one by none; a release
    whose wheel is another distribution's (`[release_dist]`) is one of the rows."""
    data = releases(package)
    patches = [p for p in load_catalogue() if p.package == package]
    assert patches and data.tested and not set(data.tested) & set(data.refused)
    assert {release for release, _ in data.release_dists} <= set(data.all_releases)
    assert all(data.dist_for(release) != data.dist for release, _ in data.release_dists)
    for release in data.tested:
        version = Version(release)
        assert any(p.supports(version) or p.is_native(version) for p in patches), release
    for release in data.refused:
        version = Version(release)
        assert not any(p.supports(version) or p.is_native(version) for p in patches), release


def test_verl_fingerprints_are_newest_first_and_cover_the_tested_releases() -> None:
    data = releases("verl")
    found = [Version(f.release) for f in data.fingerprints]
    assert found == sorted(found, reverse=True)
    assert {Version(r) for r in data.tested} <= set(found)


def test_verl_defaults_cover_every_tested_release() -> None:
    data = releases("verl")
    assert data.defaults_for(data.assume_when_unknown) is not None
    assert all(data.defaults_for(r) is not None for r in data.tested)
    assert data.defaults_for("not a version") is None


def test_patch_toml_cannot_hold_tested_releases(tmp_path: Path) -> None:
    """One home per fact: a `tested` list or a `native` cut-off in a patch.toml is refused."""
    folder = tmp_path / "x.patch"
    folder.mkdir()
    source = (catalogue.patches_dir() / "verl.debug-metrics" / "patch.toml").read_text()
    (folder / "patch.toml").write_text(source + '\ntested = ["0.6.0"]\n')
    with pytest.raises(ValueError, match="belong in the release data"):
        catalogue._load(folder)


def test_a_patchs_tested_releases_are_derived() -> None:
    assert catalogue.get_patch("verl.request-id").tested == ("0.7.1", "0.8.0", "0.9.0", "0.9.1")
    assert catalogue.get_patch("verl.legacy-fsdp-workers").tested == ("0.6.0", "0.6.1", "0.7.0", "0.7.1")
    assert "0.5.11" not in catalogue.get_patch("sglang.model-runner").tested  # native: nothing to patch


def test_unknown_keys_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "releases").mkdir()
    (tmp_path / "releases" / "sglang.toml").write_text('tested = ["0.5.3"]\ntestd = ["0.5.8"]\n')
    monkeypatch.setattr(releases_module, "patches_dir", lambda: tmp_path)
    with pytest.raises(ValueError, match="unknown keys \\['testd'\\]"):
        releases_module._load("sglang")


def test_compatibility_tables_are_current() -> None:
    """Every table of the compatibility page (docs/compatibility.md) is what the catalogue and the
    release data generate: `rlprobe-patch matrix --write-docs` after a data change."""
    page = REPO / "docs" / "compatibility.md"
    text = page.read_text()
    assert matrix.section(text, matrix.RELEASE_MARKERS, page)[1] == matrix.release_tables()
    cells = matrix.expected_cells()
    assert matrix.section(text, matrix.MARKERS, page)[1] == matrix.markdown(cells)
    assert {(c.package, c.release) for c in cells} == {
        (p, r) for p in PACKAGES for r in matrix.releases(p).all_releases
    }


def test_a_notice_above_a_run_fact() -> None:
    """`above` in a notice's data: it applies when one of the run's facts exceeds its number, or
    when the run is not known (no --script); the Megatron hooks' pipeline notice uses it."""
    engine = next(p for p in load_catalogue() if p.id == "verl.megatron-engine")
    notice = next(n for n in engine.notices if n.above)
    assert dict(notice.above) == {"actor_pp": 1, "actor_vpp": 1}
    release = Version("0.9.1")
    assert notice.applies(release, None)
    assert notice.applies(release, {"actor_pp": 2, "actor_vpp": None})
    assert notice.applies(release, {"actor_pp": 1, "actor_vpp": 2})
    assert not notice.applies(release, {"actor_pp": 1, "actor_vpp": None})
    assert not notice.applies(release, {"actor_pp": True})  # a bool is not a size


def test_the_capture_patches_are_the_packages_consistency_patches() -> None:
    """`capture_patches` (the patches a log-prob capture run needs, named by the report's next steps and the capture
    run's notice) are patches of that package, each in `apply --mode consistency`'s set, as the notice says."""
    patches = {p.id: p for p in load_catalogue()}
    named = {package: releases(package).capture_patches for package in PACKAGES}
    assert named["verl"] and named["vllm"]
    for package, ids in named.items():
        for patch_id in ids:
            assert patches[patch_id].package == package and "consistency" in patches[patch_id].modes, patch_id


def test_src_keys_nothing_on_a_release_or_a_patch_id() -> None:
    """Release knowledge lives in the catalogue's data, so the next upstream release is a data
    edit: no release number of any package's data file is written in `src/` (code, messages,
    comments), and no code compares with a patch id (a string constant that is exactly an id).
    Messages may name a patch for the user. (The rule regressed once, unnoticed, before this test.)"""
    import ast
    import re

    src = REPO / "src" / "rlprobe_patch"  # the source, not an installed copy
    ids = {p.id for p in load_catalogue()}
    numbers = sorted({r for package in PACKAGES for r in releases(package).all_releases}, key=len, reverse=True)
    release = re.compile(r"(?<![\w.-])(" + "|".join(map(re.escape, numbers)) + r")(?![\w-]|\.\d)")
    found = []
    for path in sorted(src.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        for n, line in enumerate(text.splitlines(), 1):
            found += [f"{path.relative_to(src)}:{n}: release {m.group(1)}" for m in release.finditer(line)]
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Constant) and node.value in ids:
                found.append(f"{path.relative_to(src)}:{node.lineno}: patch id {node.value}")
    assert found == []
