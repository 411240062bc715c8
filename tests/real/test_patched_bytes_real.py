"""The bytes every patch writes on every real release cell are the pinned ones (tests/data/patched-bytes.json).

The cells and how the pins are made (and regenerated, with a patch's `revision` bump):
tests/patched_bytes.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from patched_bytes import DATA, cells, produced


@pytest.mark.parametrize("cell", sorted(cells()))
def test_bytes_of_every_real_cell_are_unchanged(cell: str, tmp_path: Path) -> None:
    pinned = json.loads(DATA.read_text())["cells"]
    assert produced(cell, cells()[cell], tmp_path) == pinned[cell]
