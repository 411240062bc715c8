"""Release knowledge, as data: `patches/releases/<package>.toml`, one file per upstream package.

The one place code asks which releases are tested, which worker path a verl release runs the
PPO actor through, whether an SGLang release dumps with msprobe itself, the structural
fingerprints of verl releases, the release defaults the launch-script reader falls back to,
which lines the skill's checker prints for a patch a release cannot take, and other
per-release cut-offs. Adding a release is an edit of these files plus test cases
(CONTRIBUTING.md); no release number lives in the engine.

Kept free of LibCST so that the script reader can use it without loading the codemods.
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib

PACKAGE_FILES = {
    "verl": "verl.toml",
    "sglang": "sglang.toml",
    "vllm_ascend": "vllm-ascend.toml",
    "vllm": "vllm.toml",
    "slime": "slime.toml",
}
KNOWN_KEYS = {
    "dist",
    "release_dist",
    "archive",
    "default_backend",
    "reports",
    "tested",
    "refused",
    "assume_when_unknown",
    "native",
    "cutoff",
    "worker_path",
    "fingerprint",
    "checker_fails",
    "release",
    "wheel_python",
    "compared",
    "precision_debugger_stage",
    "mismatch_guidance",
    "diagnosis_confirm",
    "capture_patches",
}


CATALOGUE_ENV = "RLPROBE_PATCH_CATALOGUE"


def patches_dir() -> Path:
    """`patches/` inside the installed wheel, else the source checkout's top-level folder.

    `$RLPROBE_PATCH_CATALOGUE` names another catalogue folder (the tests' edited copies, to
    prove upgrades from one revision of a patch to the next)."""
    override = os.environ.get(CATALOGUE_ENV)
    if override:
        return Path(override)
    package = Path(__file__).resolve().parents[1]  # rlprobe_patch/
    for candidate in (package / "patches", package.parents[1] / "patches"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("the patch catalogue (patches/) is missing from this installation")


def releases_dir() -> Path:
    return patches_dir() / "releases"


def _in(specifier: SpecifierSet, version: Version) -> bool:
    return specifier.contains(version, prereleases=True)


@dataclass(frozen=True)
class WorkerPath:
    """Which verl worker path runs the PPO actor on the releases in `versions`.

    `impl` is "engine" or "legacy"; with `setting`, the run's `trainer.<setting>` chooses:
    `engine_when` gives the engine workers, anything else `impl`."""

    versions: SpecifierSet
    impl: str
    why: str
    setting: str = ""
    engine_when: str = ""


@dataclass(frozen=True)
class Fingerprint:
    """A file or folder (and optionally a text in it) that first appears in `release`."""

    path: str
    release: str
    text: str = ""


@dataclass(frozen=True)
class ProfilerStage:
    """A stage of verl's precision_debugger profiler: the releases that accept it, its role, the key that
    turns the role's profiler on ("" where the role has none), the releases where a method runs under it."""

    name: str
    role: str
    versions: SpecifierSet
    enable: str = ""
    dumps: SpecifierSet | None = None  # None: no release runs a method under it (accepted, dumps nothing)

    def accepted(self, version: Version) -> bool:
        return _in(self.versions, version)

    def dumps_on(self, version: Version) -> bool:
        return self.dumps is not None and _in(self.dumps, version)


@dataclass(frozen=True)
class MismatchGuidance:
    """A framework's own levels for its train-vs-rollout metric: above `warn` a warning, above `fail` a mismatch."""

    metric: str
    warn: float
    fail: float
    source: str  # where the numbers come from, printed with every verdict made from them


@dataclass(frozen=True)
class DiagnosisConfirm:
    """A run with one setting changed that confirms a cause of a train-vs-rollout mismatch (`[[diagnosis_confirm]]`)."""

    cause: str  # the diagnosis' name for it (report/diagnosis.py)
    set: str  # KEY=VALUE, as `rlprobe-patch script --set` takes it
    versions: SpecifierSet  # the releases that have the key
    why: str  # what the run shows


@dataclass(frozen=True)
class DefaultsRange:
    """The release defaults of verl's ppo_trainer.yaml for `start` <= release < `below`."""

    start: str
    below: str
    defaults: dict[str, Any]

    def covers(self, version: Version) -> bool:
        return version >= Version(self.start) and (not self.below or version < Version(self.below))

    @property
    def label(self) -> str:
        return f"{self.start}..{self.below}"


@dataclass(frozen=True)
class PackageReleases:
    """What `patches/releases/<package>.toml` says about one upstream package."""

    package: str
    dist: str  # the name on the package index
    tested: tuple[str, ...]  # releases every cell of which is run for real (applied, or native)
    refused: tuple[str, ...]  # releases outside every patch's range, run to prove the refusal
    path: Path
    native: SpecifierSet | None = None  # releases that dump with msprobe themselves
    cutoffs: tuple[tuple[str, SpecifierSet], ...] = ()  # (feature, releases that have it)
    worker_paths: tuple[WorkerPath, ...] = ()
    fingerprints: tuple[Fingerprint, ...] = ()  # newest first
    checker_fails: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (patch id, FAIL lines without it)
    assume_when_unknown: str = ""
    defaults: tuple[DefaultsRange, ...] = ()
    # Not on the package index: the release archive (`git archive <tag>`), relative to an upstream
    # folder (`matrix --upstream`), with `{version}` for the release.
    archive: str = ""
    # The training backend apply hooks when --backend is not given (a framework with one hooked backend).
    default_backend: str = ""
    # Tags whose own files say another version ({tag: what its setup.py says}).
    reports: tuple[tuple[str, str], ...] = ()
    # The Python version the index's wheels of `dist` are built for, where not every one is abi3.
    wheel_python: str = ""
    # Tested releases whose target files are also compared with another distribution's wheel.
    compared: tuple[str, ...] = ()
    # Releases whose wheel comes from another distribution than `dist` ({release: distribution}).
    release_dists: tuple[tuple[str, str], ...] = ()
    # verl's precision_debugger stages (`[[precision_debugger_stage]]`), in the file's order.
    profiler_stages: tuple[ProfilerStage, ...] = ()
    # The package's guidance on its mismatch metric (`[mismatch_guidance]`), which `report` grades with.
    guidance: MismatchGuidance | None = None
    # The runs that confirm a diagnosed cause (`[[diagnosis_confirm]]`), in the file's order.
    confirms: tuple[DiagnosisConfirm, ...] = ()
    # The patches of this package a log-prob capture run needs applied (`capture_patches`): what `report` reads.
    capture_patches: tuple[str, ...] = ()

    def stages_of(self, version: Version) -> tuple[ProfilerStage, ...]:
        """The precision_debugger stages `version` accepts."""
        return tuple(stage for stage in self.profiler_stages if stage.accepted(version))

    def dist_for(self, release: str) -> str:
        """The distribution on the package index whose wheel is `release`'s tree."""
        return dict(self.release_dists).get(release, self.dist)

    def reported(self, release: str) -> str:
        """The version a tree of the tag `release` says it is."""
        return dict(self.reports).get(release, release)

    @property
    def all_releases(self) -> tuple[str, ...]:
        """Every release row of the matrix: tested and refused, oldest first."""
        return tuple(sorted({*self.tested, *self.refused}, key=Version))

    def is_native(self, version: Version) -> bool:
        return self.native is not None and _in(self.native, version)

    def has(self, feature: str, version: Version) -> bool:
        """Whether `version` has `feature` (a `[cutoff]` key of the file)."""
        return _in(dict(self.cutoffs)[feature], version)

    def cutoff(self, feature: str) -> SpecifierSet:
        return dict(self.cutoffs)[feature]

    def worker_path(self, version: Version) -> WorkerPath:
        for entry in self.worker_paths:
            if _in(entry.versions, version):
                return entry
        raise LookupError(f"{self.path.name}: no [[worker_path]] covers {self.package} {version}")

    def expected_checker_fails(self, patch_id: str) -> tuple[str, ...]:
        return dict(self.checker_fails).get(patch_id, ())

    def defaults_for(self, release: str) -> DefaultsRange | None:
        try:
            version = Version(release)
        except InvalidVersion:
            return None
        return next((entry for entry in self.defaults if entry.covers(version)), None)


def _load(package: str) -> PackageReleases:
    path = releases_dir() / PACKAGE_FILES[package]
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    if unknown := set(data) - KNOWN_KEYS:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)}; known: {sorted(KNOWN_KEYS)}")
    return PackageReleases(
        package=package,
        dist=data.get("dist", package),
        archive=data.get("archive", ""),
        default_backend=data.get("default_backend", ""),
        reports=tuple(data.get("reports", {}).items()),
        wheel_python=data.get("wheel_python", ""),
        compared=tuple(data.get("compared", ())),
        release_dists=tuple(data.get("release_dist", {}).items()),
        tested=tuple(data["tested"]),
        refused=tuple(data.get("refused", ())),
        path=path,
        native=SpecifierSet(data["native"]) if "native" in data else None,
        cutoffs=tuple((k, SpecifierSet(v)) for k, v in data.get("cutoff", {}).items()),
        worker_paths=tuple(
            WorkerPath(
                SpecifierSet(w["versions"]),
                w["impl"],
                " ".join(w.get("why", "").split()),
                w.get("setting", ""),
                w.get("engine_when", ""),
            )
            for w in data.get("worker_path", [])
        ),
        fingerprints=tuple(
            Fingerprint(f["path"], f["release"], f.get("text", "")) for f in data.get("fingerprint", [])
        ),
        checker_fails=tuple((k, tuple(v)) for k, v in data.get("checker_fails", {}).items()),
        assume_when_unknown=data.get("assume_when_unknown", ""),
        defaults=tuple(
            DefaultsRange(r["from"], r.get("below", ""), dict(r["defaults"])) for r in data.get("release", [])
        ),
        profiler_stages=tuple(
            ProfilerStage(
                st["name"],
                st["role"],
                SpecifierSet(st["versions"]),
                st.get("enable", ""),
                SpecifierSet(st["dumps"]) if "dumps" in st else None,
            )
            for st in data.get("precision_debugger_stage", [])
        ),
        guidance=MismatchGuidance(**data["mismatch_guidance"]) if "mismatch_guidance" in data else None,
        confirms=tuple(
            DiagnosisConfirm(c["cause"], c["set"], SpecifierSet(c["versions"]), " ".join(c["why"].split()))
            for c in data.get("diagnosis_confirm", [])
        ),
        capture_patches=tuple(data.get("capture_patches", ())),
    )


@functools.cache
def releases(package: str) -> PackageReleases:
    """The release data of `package` ("verl", "sglang", "vllm_ascend", "vllm", "slime")."""
    return _load(package)


def tested_releases(package: str) -> tuple[str, ...]:
    return releases(package).tested
