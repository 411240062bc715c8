"""The bytes every patch writes on every real release cell, pinned by hash: the cells, what apply
writes on each, and the writer of the pins (`python tests/patched_bytes.py`).

`tests/data/patched-bytes.json` holds the sha256 of each file that `apply` changes or adds on
each real release (the wheels of the release data, as `matrix` runs them), recorded before the
worker-hook payloads were assembled from shared parts (issue 14). A tree patched by an earlier
release must still read as applied, so the inserted text may change only with a patch's
`revision`: then regenerate the hashes (`python tests/patched_bytes.py`) in that change.
Only hashes are kept, never third-party code.

Checked by tests/real/test_patched_bytes_real.py (every cell) and tests/unit/test_patched_bytes.py
(the pinned cells are the catalogue's).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from click.testing import CliRunner
from packaging.version import Version
from script_oracle import SHARED

from rlprobe_patch import matrix
from rlprobe_patch.catalogue import wheels
from rlprobe_patch.catalogue.patches import Patch, load_catalogue
from rlprobe_patch.catalogue.trees import ROOT_OPTIONS
from rlprobe_patch.cli import main

DATA = Path(__file__).resolve().parent / "data" / "patched-bytes.json"
# A non-default config path baked into each hook, on one release per patch (the newest it takes).
BAKED = {"verl": "--msprobe-config", "sglang": "--sglang-config"}
BAKED_PATH = "/opt/msprobe/config.json"


def _applies(patch: Patch, release: str) -> bool:
    return patch.supports(Version(release)) and not patch.is_native(Version(release))


def cells() -> dict[str, list[str]]:
    """{cell name: apply arguments, without the root}: each patch alone (verl's backend-independent
    patches as their consistency set, as `matrix` runs them), plus one run with a baked config path."""
    out: dict[str, list[str]] = {}
    catalogue = load_catalogue()
    for package in dict.fromkeys(p.package for p in catalogue):
        patches = [p for p in catalogue if p.package == package]
        for release in matrix.releases_of(package):
            for group, members in matrix.groups_of(package, patches).items():
                if not any(_applies(p, release) for p in members):
                    continue
                if group == "consistency":
                    args = ["--backend", "fsdp", "--mode", "consistency", "--worker-impl", "engine"]
                elif package == "verl":
                    (patch,) = members
                    args = ["--backend", patch.backends[0], "--only", patch.id, "--worker-impl", patch.worker_impl]
                else:
                    args = ["--only", group]  # the patch alone, as matrix runs it
                out[f"{package} {release} {group}"] = args
        for patch in patches:
            if patch.package in BAKED and "any" not in patch.backends:
                newest = [r for r in matrix.releases_of(package) if _applies(patch, r)][-1]
                plain = out[f"{package} {newest} {patch.id}"]
                out[f"{package} {newest} {patch.id} baked"] = [*plain, BAKED[package], BAKED_PATH]
    return out


def produced(cell: str, args: list[str], scratch: Path) -> dict[str, str]:
    """{path: sha256} of every file `apply` changes or adds in a fresh copy of the cell's release
    (slime's releases from their archives in ../shared/upstream, as the slime tests read them)."""
    os.environ.setdefault("RLPROBE_UPSTREAM", str(SHARED / "upstream"))
    package, release = cell.split()[:2]
    root = wheels.unpack_release(wheels.fetch_release(package, release), scratch / cell.replace(" ", "_"), package)
    before = matrix.snapshot(root)
    result = CliRunner().invoke(main, ["apply", ROOT_OPTIONS[package], str(root), *args, "--json"])
    assert result.exit_code == 0, f"{cell}: {result.output}"
    after = matrix.snapshot(root)
    return {path: digest for path, (digest, _) in after.items() if before.get(path, (None,))[0] != digest}


def write() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["RLPROBE_PATCH_STATE_HOME"] = scratch  # keep the scratch trees out of the registry
        hashes = {}
        for cell, args in cells().items():
            print(cell, file=sys.stderr)
            hashes[cell] = produced(cell, args, Path(scratch))
    doc = {"about": " ".join(__doc__.split("\n\n")[1].split()), "cells": hashes}
    DATA.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    write()
