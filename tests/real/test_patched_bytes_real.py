"""The bytes every patch writes on every real release cell are the pinned ones (tests/data/patched-bytes.json).

The cells and how the pins are made (and regenerated, with a patch's `revision` bump):
tests/patched_bytes.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from packaging.version import Version
from patched_bytes import DATA, cells, produced


def cell_params() -> list[object]:
    """Every cell; those of a release between the oldest and the newest its patch (group) is pinned on
    are the exhaustive leg's (`-m exhaustive`, issue 35): the README's test command keeps both ends."""
    by_group: dict[tuple[str, ...], list[str]] = {}
    for name in cells():
        package, release, *group = name.split(" ")
        by_group.setdefault((package, *group), []).append(release)
    ends = {key: {min(found, key=Version), max(found, key=Version)} for key, found in by_group.items()}
    params: list[object] = []
    for name in sorted(cells()):
        package, release, *group = name.split(" ")
        middle = release not in ends[(package, *group)]
        params.append(pytest.param(name, marks=pytest.mark.exhaustive) if middle else name)
    return params


@pytest.mark.parametrize("cell", cell_params())
def test_bytes_of_every_real_cell_are_unchanged(cell: str, tmp_path: Path) -> None:
    pinned = json.loads(DATA.read_text())["cells"]
    assert produced(cell, cells()[cell], tmp_path) == pinned[cell]
