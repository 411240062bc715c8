"""The compatibility matrix, generated: every patch x release cell the catalogue claims, run for real.

A release is a cell of each patch of its package. The releases are the `tested` and
`refused` releases of the package's data (`patches/releases/<package>.toml`). Each cell runs
in a scratch copy of the real wheel from the package index (`catalogue.wheels`: `pip download --no-deps`,
cached): apply, verify, re-apply (must write nothing), revert (must leave every file
byte-identical with its mode). The expected outcome comes from the catalogue (`native`,
`versions`); a cell whose run disagrees is `failing`, with the reason.

Backend hooks run alone (`--only`); verl's backend-independent patches run as their
`--mode consistency` set (the skill's consistency rules check them together).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from packaging.version import Version

from rlprobe_patch.base.errors import PatchError, RefusedError
from rlprobe_patch.base.fsio import atomic_write, sha256
from rlprobe_patch.catalogue.patches import Patch, load_catalogue
from rlprobe_patch.catalogue.releases import releases
from rlprobe_patch.catalogue.trees import find_tree
from rlprobe_patch.catalogue.wheels import fetch_release, unpack_release
from rlprobe_patch.record.folder import RECORD_FOLDER_NAME

APPLIED, REFUSED, NATIVE, FAILING = "applied", "refused-by-design", "native", "failing"
MARKERS = ("<!-- matrix -->", "<!-- /matrix -->")
# The compatibility page's release tables, generated from the catalogue and the release data (no run).
RELEASE_MARKERS = ("<!-- releases -->", "<!-- /releases -->")


def snapshot(root: Path) -> dict[str, tuple[str, int]]:
    """Content hash and mode of every file outside our state folder."""
    return {
        p.relative_to(root).as_posix(): (sha256(p.read_bytes()), p.stat().st_mode & 0o7777)
        for p in sorted(root.rglob("*"))
        if p.is_file() and RECORD_FOLDER_NAME not in p.relative_to(root).parts
    }


@dataclass
class Cell:
    patch: str
    package: str
    release: str
    outcome: str  # APPLIED / REFUSED / NATIVE / FAILING
    detail: str = ""

    def to_json(self) -> dict[str, str]:
        return asdict(self)


def expected(patch: Patch, release: str) -> str:
    version = Version(release)
    if patch.is_native(version):
        return NATIVE
    return APPLIED if patch.supports(version) else REFUSED


def releases_of(package: str) -> list[str]:
    """The release rows of `package`: tested and refused, from its release data."""
    return list(releases(package).all_releases)


def _run_group(root: Path, patches: list[Patch], group: str) -> dict[str, tuple[str, str]]:
    """One apply/verify/re-apply/revert cycle; {patch id: (outcome, detail)} for `patches`."""
    from rlprobe_patch.core.apply import apply
    from rlprobe_patch.core.revert import revert
    from rlprobe_patch.core.selection import Selection
    from rlprobe_patch.core.verify import verify

    tree = find_tree(patches[0].package, root)
    if group == "consistency":
        selection = Selection("fsdp", "consistency", worker_impl="engine")
    else:
        (patch,) = patches
        selection = Selection(patch.backends[0], None, (patch.id,), worker_impl=patch.worker_impl)
    original = snapshot(root)
    try:
        result = apply(tree, selection)
    except PatchError as exc:
        detail = "; ".join([exc.message, *exc.details])
        outcome = REFUSED if snapshot(root) == original and not (root / RECORD_FOLDER_NAME).exists() else FAILING
        return {p.id: (outcome, detail) for p in patches}
    states = {p.patch.id: p for p in result.plan.patches}
    failure = ""
    if result.record is not None:
        checked = verify(tree)
        bad = [f"{c.check}: {c.detail}" for c in checked.checks if not c.ok]
        if bad:
            failure = "verify: " + "; ".join(bad)
        patched = snapshot(root)
        again = apply(tree, selection)
        if again.record is not None or snapshot(root) != patched:
            failure = failure or "a second apply wrote again"
        revert(root, tree)
        if snapshot(root) != original:
            failure = failure or "revert did not restore every file byte for byte"
    elif snapshot(root) != original:
        failure = "wrote without a record"
    cells = {}
    for patch in patches:
        plan = states.get(patch.id)
        if plan is None:
            cells[patch.id] = (FAILING, "not planned")
        elif plan.native:
            cells[patch.id] = (NATIVE, "")
        elif plan.skipped:
            cells[patch.id] = (REFUSED, "")
        elif failure:
            cells[patch.id] = (FAILING, failure)
        elif plan.state_name == "applicable" and result.record is not None:
            cells[patch.id] = (APPLIED, "")
        else:
            cells[patch.id] = (FAILING, f"state {plan.state_name}: {'; '.join(plan.reasons)}")
    return cells


def groups_of(package: str, patches: list[Patch]) -> dict[str, list[Patch]]:
    """The cycles a release row runs: verl's backend-independent patches as one consistency set,
    every other patch alone."""
    groups: dict[str, list[Patch]] = {}
    for p in patches:
        set_patch = package == "verl" and "any" in p.backends
        groups.setdefault("consistency" if set_patch else p.id, []).append(p)
    return groups


def expected_cells() -> list[Cell]:
    """Every cell of the matrix with the outcome the catalogue and the release data claim, in
    the order `run_matrix` produces them: the compatibility page's matrix must read like this."""
    cells = []
    catalogue = load_catalogue()
    for package in dict.fromkeys(p.package for p in catalogue):
        patches = [p for p in catalogue if p.package == package]
        for release in releases_of(package):
            for members in groups_of(package, patches).values():
                cells += [Cell(p.id, package, release, expected(p, release)) for p in members]
    return cells


@contextlib.contextmanager
def _scratch_registry() -> Iterator[None]:
    """The scratch trees must not land in the user's registry of patched trees."""
    saved = os.environ.get("RLPROBE_PATCH_STATE_HOME")
    with tempfile.TemporaryDirectory(prefix="rlprobe-matrix-state-") as home:
        os.environ["RLPROBE_PATCH_STATE_HOME"] = home
        try:
            yield
        finally:
            if saved is None:
                os.environ.pop("RLPROBE_PATCH_STATE_HOME", None)
            else:
                os.environ["RLPROBE_PATCH_STATE_HOME"] = saved


def run_matrix(
    patch_ids: tuple[str, ...] = (),
    releases: tuple[str, ...] = (),
    cache: Path | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> list[Cell]:
    """Run the cells (all, or those of the patches / releases named) and compare with the catalogue."""
    chosen = [p for p in load_catalogue() if not patch_ids or p.id in patch_ids]
    cells: list[Cell] = []
    with _scratch_registry(), tempfile.TemporaryDirectory(prefix="rlprobe-matrix-") as tmp:
        for package in dict.fromkeys(p.package for p in chosen):
            patches = [p for p in chosen if p.package == package]
            for release in releases_of(package):
                if releases and release not in releases:
                    continue
                source = fetch_release(package, release, cache)
                for group, members in groups_of(package, patches).items():
                    progress(f"{package} {release}: {group}")
                    root = unpack_release(source, Path(tmp) / f"{package}-{release}-{group}", package)
                    try:
                        results = _run_group(root, members, group)
                    except Exception as exc:  # a bug in a cell must not hide the other cells
                        results = {p.id: (FAILING, f"internal error: {exc!r}") for p in members}
                    shutil.rmtree(root, ignore_errors=True)
                    for p in members:
                        outcome, detail = results[p.id]
                        if outcome != FAILING and outcome != expected(p, release):
                            outcome, detail = FAILING, f"expected {expected(p, release)}, got {outcome}: {detail}"
                        cells.append(Cell(p.id, package, release, outcome, detail))
    return cells


def markdown(cells: list[Cell]) -> str:
    """One table per package: a row per release, a column per patch."""
    out = []
    for package in dict.fromkeys(c.package for c in cells):
        mine = [c for c in cells if c.package == package]
        patches = list(dict.fromkeys(c.patch for c in mine))
        by = {(c.patch, c.release): c for c in mine}
        out.append(f"| {package} | " + " | ".join(f"`{p}`" for p in patches) + " |")
        out.append("|---|" + "---|" * len(patches))
        for release in sorted({c.release for c in mine}, key=Version):
            row = [by[(p, release)].outcome if (p, release) in by else "" for p in patches]
            out.append(f"| {release} | " + " | ".join(row) + " |")
        out.append("")
    failing = [c for c in cells if c.outcome == FAILING]
    for c in failing:
        out.append(f"- failing: {c.patch} on {c.package} {c.release}: {c.detail}")
    return "\n".join(out).rstrip() + "\n"


def section(text: str, markers: tuple[str, str], where: Path) -> tuple[str, str, str]:
    """(before, between, after) the one pair of `markers` in `text`."""
    start, end = markers
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise RefusedError(f"{where}: needs exactly one {start} ... {end} pair", hint="add the markers first")
    head, rest = text.split(start)
    between, tail = rest.split(end)
    return head, between.removeprefix("\n"), tail


def write_tables(page: Path, table: str) -> None:
    """Replace the text between the matrix markers of `page` (docs/compatibility.md), and the release tables between
    the release markers when it has them."""
    text = page.read_text(encoding="utf-8")
    head, _, tail = section(text, MARKERS, page)
    text = f"{head}{MARKERS[0]}\n{table}{MARKERS[1]}{tail}"
    if RELEASE_MARKERS[0] in text:
        head, _, tail = section(text, RELEASE_MARKERS, page)
        text = f"{head}{RELEASE_MARKERS[0]}\n{release_tables()}{RELEASE_MARKERS[1]}{tail}"
    atomic_write(page, text.encode())


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
    ]


def _worker_note(release: str) -> str:
    path = releases("verl").worker_path(Version(release))
    if path.setting:
        return f"the engine runs the PPO actor only with `trainer.{path.setting}={path.engine_when}`: notice"
    return "" if path.impl == "engine" else f"the PPO actor runs the {path.impl} workers: notice"


def _consistency_cell(patch: Patch, release: str) -> str:
    version = Version(release)
    if not patch.supports(version):
        return "not for this release"
    # The folder too: two trainers' files are both called ray_trainer.py (ppo/, separation/).
    files = list(dict.fromkeys("/".join(Path(s.target).parts[-2:]) for s in patch.sites_for(version)))
    text = f"applied ({', '.join(files)})" if len(patch.sites) > 1 else "applied"
    return text + ("; with a warning" if patch.warnings_for(version) else "")


def release_tables() -> str:
    """The compatibility page's release tables, from the catalogue and `patches/releases/` alone."""
    catalogue = load_catalogue()
    verl = releases("verl")
    engines = [p for p in catalogue if p.package == "verl" and p.worker_impl == "engine" and "any" not in p.backends]
    legacy = [p for p in catalogue if p.package == "verl" and p.worker_impl == "legacy"]
    the_set = [p for p in catalogue if p.package == "verl" and "any" in p.backends and "consistency" in p.modes]

    def outcome(patch: Patch, release: str) -> str:
        return "applied" if patch.supports(Version(release)) else "refused"

    out = ["Engine hooks (`tests/real/test_real_releases.py`, each backend alone):", ""]
    header = ["verl", *(" / ".join(p.backends) for p in engines), "notes"]
    rows = [
        [r, *(outcome(p, r) for p in engines), _worker_note(r) if r in verl.tested else ""] for r in verl.all_releases
    ]
    out += _table(header, rows)
    out += ["`--mode consistency` (`test_consistency_set_cell`, each release x fsdp / megatron):", ""]
    header = ["verl", *(f"`{p.id}`" for p in the_set)]
    out += _table(header, [[r, *(_consistency_cell(p, r) for p in the_set)] for r in verl.tested])
    out += ["Legacy worker hooks (`tests/real/test_legacy_workers.py`, `--only`):", ""]
    out += _table(
        ["verl", *(f"`{p.id}`" for p in legacy)], [[r, *(outcome(p, r) for p in legacy)] for r in verl.tested]
    )
    out += ["Inference engines (`tests/real/test_inference_engines.py`, `tests/real/test_vllm.py`):", ""]
    rows = []
    for package in ("sglang", "vllm_ascend", "vllm"):
        data = releases(package)
        for patch in [p for p in catalogue if p.package == package]:
            by_outcome: dict[tuple[str, str], list[str]] = {}  # (distribution, outcome): releases
            for release in data.all_releases:
                by_outcome.setdefault((data.dist_for(release), expected(patch, release)), []).append(release)
            rows += [[dist, ", ".join(rs), f"`{patch.id}`: {what}"] for (dist, what), rs in by_outcome.items()]
    out += _table(["package", "releases", "result"], rows)
    slime = [p for p in catalogue if p.package == "slime"]
    out += ["slime (`tests/real/test_slime.py`, each patch alone, on the release archives):", ""]
    rows = [[r, *(outcome(p, r) for p in slime)] for r in releases("slime").all_releases]
    out += _table(["slime", *(f"`{p.id}`" for p in slime)], rows)
    return "\n".join(out).rstrip() + "\n"
