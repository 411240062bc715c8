"""The patch catalogue: one folder per patch under `patches/`, discovered, never listed by hand.

Each folder holds `patch.toml` (id, target file, backends, version range, why, notices),
`payload.py` (the inserted code) and `codemod.py` (its anchors), plus `cases/` with
before/after examples that the test suite runs.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import hashlib
import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from rlprobe_patch import __version__
from rlprobe_patch import codemod as toolkit
from rlprobe_patch.catalogue.releases import patches_dir, releases
from rlprobe_patch.codemod import PatchCodemod, Payload

__all__ = ["Patch", "get_patch", "load_catalogue", "patches_dir", "select"]

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib


@dataclass(frozen=True)
class Notice:
    versions: SpecifierSet
    text: str
    # A warning is repeated by `verify`: the patch is in place but part of the job is not done.
    warning: bool = False
    # Facts of the run (from `--script`, composed by Hydra) under which the notice does not apply.
    unless: tuple[tuple[str, Any], ...] = ()
    # Facts of the run of which one must exceed its number for the notice to apply (`--script`
    # read); without the run's facts the notice always applies.
    above: tuple[tuple[str, int], ...] = ()

    def applies(self, version: Version, facts: dict[str, Any] | None) -> bool:
        if not self.versions.contains(version, prereleases=True):
            return False
        if facts and self.above and not any(_exceeds(facts.get(k), v) for k, v in self.above):
            return False
        return not (facts and self.unless and all(facts.get(k) == v for k, v in self.unless))


def _exceeds(value: Any, limit: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > limit


@dataclass(frozen=True)
class Site:
    """One file a patch edits, on the releases in `versions`, with the codemod class that edits it."""

    target: str
    codemod_class: str
    versions: SpecifierSet
    # A non-required site is skipped on trees that lack its file (an optional, experimental part of verl).
    required: bool = True


@dataclass(frozen=True)
class Patch:
    id: str
    revision: int
    package: str
    sites: tuple[Site, ...]
    backends: tuple[str, ...]
    modes: tuple[str, ...]
    versions: SpecifierSet
    why: str
    refused_why: str
    folder: Path
    notices: tuple[Notice, ...] = ()
    overrides: dict[str, Any] = field(default_factory=dict)
    # verl's worker path the patch hooks: "engine" (engine workers) or "legacy" (fsdp/megatron workers).
    worker_impl: str = "engine"
    # Releases that do this themselves (no patch), and how to switch it on there.
    native: SpecifierSet | None = None
    native_how: str = ""
    # False: the skill's checkers (check-consistency-patch) know nothing of it; applied alone, verify
    # does not run them.
    skill_checked: bool = True

    @functools.cached_property
    def _module(self) -> Any:
        module_name = "rlprobe_patch.patches." + self.id.replace(".", "_").replace("-", "_")
        spec = importlib.util.spec_from_file_location(module_name, self.folder / "codemod.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # dataclasses and `from __future__ import annotations` need it
        spec.loader.exec_module(module)
        return module

    @functools.cached_property
    def fingerprint(self) -> str:
        """Identifies the code that decides this patch's state: the tool's version, the codemod
        toolkit (partial parsing included), the files of the patch's folder and the shared parts
        its payload takes. A state remembered for a file's bytes (`RecordFolder.checked`) holds only
        under the same fingerprint."""
        digest = hashlib.sha256(__version__.encode())
        folder = sorted(p for p in self.folder.iterdir() if p.is_file())
        for path in [*_toolkit_files(), *folder, *self.payload.sources[1:]]:
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
        return digest.hexdigest()[:32]

    @functools.cached_property
    def payload(self) -> Payload:
        return Payload(self.folder / "payload.py")

    def codemod(self, site: Site) -> PatchCodemod:
        return self._codemods[site]

    @functools.cached_property
    def _codemods(self) -> dict[Site, PatchCodemod]:
        return {site: getattr(self._module, site.codemod_class)(self.payload, site.target) for site in self.sites}

    @property
    def targets(self) -> list[str]:
        return [site.target for site in self.sites]

    def sites_for(self, version: Version) -> list[Site]:
        return [site for site in self.sites if site.versions.contains(version, prereleases=True)]

    def is_native(self, version: Version) -> bool:
        return self.native is not None and self.native.contains(version, prereleases=True)

    def supports(self, version: Version) -> bool:
        return self.versions.contains(version, prereleases=True)

    def serves(self, backend: str) -> bool:
        return "any" in self.backends or backend in self.backends

    @property
    def tested(self) -> tuple[str, ...]:
        """The package's tested releases (its release data) that this patch applies to."""
        return tuple(
            r for r in releases(self.package).tested if self.supports(Version(r)) and not self.is_native(Version(r))
        )

    def is_tested(self, version: Version) -> bool:
        data = releases(self.package)  # a tag may say another version (slime's v0.2.4 says 0.2.3)
        return any(Version(v) == version or Version(data.reported(v)) == version for v in self.tested)

    def warnings_for(self, version: Version, facts: dict[str, Any] | None = None) -> list[str]:
        """Warnings for a tree of `version`; `facts` (the run's values, when a script was read) can rule some out."""
        return [n.text.format(version=version) for n in self.notices if n.warning and n.applies(version, facts)]

    def notices_for(self, version: Version, root: Path, facts: dict[str, Any] | None = None) -> list[str]:
        """Notices for a tree of `version`; `facts` (the run's values, when a script was read) can rule some out."""
        texts = [n.text.format(version=version) for n in self.notices if not n.warning and n.applies(version, facts)]
        if self.overrides:
            texts += [
                self.overrides["text"].format(cls=cls, file=file)
                for cls, file in find_overriding_classes(
                    root, self.overrides["files"], self.overrides["method"], [*self.targets, *self.overrides["exclude"]]
                )
            ]
        return texts


@functools.cache
def _toolkit_files() -> tuple[Path, ...]:
    """The modules of the codemod toolkit (`rlprobe_patch.codemod`), in a stable order."""
    return tuple(sorted(Path(toolkit.__file__).parent.glob("*.py")))


def find_overriding_classes(root: Path, pattern: str, method: str, exclude: list[str]) -> list[tuple[str, str]]:
    """Classes in files matching `pattern` (but no `exclude` glob) that define `method` themselves."""
    found = []
    for path in sorted(root.glob(pattern)):
        rel = path.relative_to(root).as_posix()
        if any(fnmatch.fnmatch(rel, glob) for glob in exclude):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if f"def {method}" not in text:
            continue
        try:
            module = ast.parse(text)
        except SyntaxError:
            continue
        for cls in module.body:
            if isinstance(cls, ast.ClassDef) and any(
                isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == method
                for node in ast.walk(cls)
            ):
                found.append((cls.name, rel))
    return found


def _load(folder: Path) -> Patch:
    meta = tomllib.loads((folder / "patch.toml").read_text(encoding="utf-8"))
    if moved := {"tested", "native"} & set(meta):
        # One home per fact: releases and native cut-offs live in patches/releases/<package>.toml.
        raise ValueError(f"{folder / 'patch.toml'}: {sorted(moved)} belong in the release data (patches/releases/)")
    versions = SpecifierSet(meta["versions"])
    if "site" in meta:
        sites = tuple(
            Site(s["target"], s["codemod"], SpecifierSet(s.get("versions", str(versions))), s.get("required", True))
            for s in meta["site"]
        )
    else:
        sites = (Site(meta["target"], meta.get("codemod", "Codemod"), versions),)
    return Patch(
        id=meta["id"],
        revision=int(meta["revision"]),
        package=meta["package"],
        sites=sites,
        backends=tuple(meta["backends"]),
        modes=tuple(meta.get("modes", ())),
        versions=versions,
        why=" ".join(meta["why"].split()),
        refused_why=meta.get("refused_why", "{version} is outside " + meta["versions"]),
        folder=folder,
        notices=tuple(
            Notice(
                SpecifierSet(n["versions"]),
                " ".join(n["text"].split()),
                n.get("warning", False),
                tuple(n.get("unless", {}).items()),
                tuple(n.get("above", {}).items()),
            )
            for n in meta.get("notice", [])
        ),
        overrides=dict(meta.get("overrides", {})),
        worker_impl=meta.get("worker_impl", "engine"),
        native=releases(meta["package"]).native if "native_how" in meta else None,
        native_how=" ".join(meta.get("native_how", "").split()),
        skill_checked=bool(meta.get("skill_checked", True)),
    )


@functools.cache
def load_catalogue() -> tuple[Patch, ...]:
    root = patches_dir()
    patches = tuple(_load(folder) for folder in sorted(root.iterdir()) if (folder / "patch.toml").is_file())
    if folder_mismatch := [p.id for p in patches if p.folder.name != p.id]:
        raise ValueError(f"patch folder names must equal their ids: {folder_mismatch}")
    return patches


def get_patch(patch_id: str) -> Patch:
    for patch in load_catalogue():
        if patch.id == patch_id:
            return patch
    raise KeyError(patch_id)


def select(package: str, backend: str, mode: str | None = None, worker_impl: str = "engine") -> list[Patch]:
    """The patches of `package` for `backend`: its worker hook alone, or with every patch of `mode`.

    The worker hook is the one of `worker_impl` ("engine" or "legacy"): the path verl's PPO
    actor takes. A mode's set is that hook plus the backend-independent patches of the mode."""
    hooks = [p for p in load_catalogue() if p.package == package and p.serves(backend) and "any" not in p.backends]
    chosen = [p for p in hooks if p.worker_impl == worker_impl]
    if mode:
        chosen += [p for p in load_catalogue() if p.package == package and "any" in p.backends and mode in p.modes]
    return chosen
