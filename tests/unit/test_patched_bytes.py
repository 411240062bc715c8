"""The pinned hashes (tests/data/patched-bytes.json) name exactly the catalogue's real release cells.

The bytes of each cell: tests/real/test_patched_bytes_real.py; the cells: tests/patched_bytes.py.
"""

from __future__ import annotations

import json

from patched_bytes import DATA, cells


def test_pinned_cells_are_the_catalogue_cells() -> None:
    assert sorted(json.loads(DATA.read_text())["cells"]) == sorted(cells())
