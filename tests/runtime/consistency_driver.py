"""Run the consistency patch set's inserted code for real, inside an installed verl (CPU torch).

Run it with the python of a runtime venv (see venvs.py), not pytest's::

    <venv>/bin/python tests/runtime/consistency_driver.py guards --out guards.json
    <venv>/bin/python tests/runtime/consistency_driver.py request-id --out rid.json
    <venv>/bin/python tests/runtime/consistency_driver.py trim --out trim.json

or several at once with ``--runs SPEC`` (tests/runtime/forked_runs.py: the imports once, each run forked).

- ``guards`` imports verl's own ``calculate_debug_metrics`` and
  ``compute_rollout_correction_and_add_to_batch`` (patched or not: whatever is installed) and
  calls them on a real ``DataProto`` with responses; the test compares patched with original,
  with and without ``PROMPTS_ONLY`` (the caller sets it in the environment).
- ``request-id`` imports verl's real ``LLMServerClient`` (0.8.0+) or ``AsyncLLMServerManager``
  (0.7.1) and awaits its real ``generate`` against a stand-in server (no Ray, no engine) that
  records the ``request_id`` it was sent and answers with a real ``TokenOutput``.
- ``trim`` takes ``RayPPOTrainer._prompts_only_batch`` and the statements inserted before
  the old-log-prob block of ``RayPPOTrainer.fit`` out of the installed, patched
  ``ray_trainer.py`` (by syntax tree; importing the trainer module is not needed) and runs
  them as written on real ``DataProto`` batches with 2-D and 3-D ``position_ids``.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import os
import sys
import traceback
from pathlib import Path

import torch

PROMPT, RESPONSE, BATCH = 5, 3, 2


def make_batch(position_dims: int):
    from verl.protocol import DataProto

    total = PROMPT + RESPONSE
    position_ids = torch.arange(total).repeat(BATCH, 1)
    if position_dims == 3:
        position_ids = position_ids.unsqueeze(1).repeat(1, 3, 1)  # mrope: (batch, 3, seq)
    tensors = {
        "input_ids": torch.arange(BATCH * total).reshape(BATCH, total),
        "attention_mask": torch.ones(BATCH, total, dtype=torch.long),
        "position_ids": position_ids,
        "responses": torch.arange(BATCH * RESPONSE).reshape(BATCH, RESPONSE) + 100,
        "response_mask": torch.ones(BATCH, RESPONSE, dtype=torch.long),
        "rollout_log_probs": torch.full((BATCH, RESPONSE), -0.5),
        "old_log_probs": torch.full((BATCH, RESPONSE), -0.25),
    }
    return DataProto.from_single_dict(tensors)


def shapes(data) -> dict[str, list[int]]:
    return {key: list(data.batch[key].shape) for key in sorted(data.batch.keys())}


def run_guards() -> dict:
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
    from verl.utils.debug.metrics import calculate_debug_metrics

    data = make_batch(2)
    metrics = calculate_debug_metrics(data)
    config = RolloutCorrectionConfig(rollout_is="token", rollout_is_threshold=2.0)
    batch, corr_metrics = compute_rollout_correction_and_add_to_batch(make_batch(2), config)
    return {
        "debug_metrics": {k: float(v) for k, v in metrics.items()},
        "rollout_correction": {
            "same_object": batch is not None,
            "metrics": {k: float(v) for k, v in sorted(corr_metrics.items())},
            "batch_keys": sorted(batch.batch.keys()),
        },
    }


class StandInServer:
    """Answers `generate.remote(...)` like a rollout server, recording the request id it saw.

    `stop_reasons` are answered in turn (a partial rollout: "aborted", then "completed")."""

    def __init__(self, stop_reasons: tuple[str, ...] = ("completed",)) -> None:
        self.seen: list[str] = []
        self.stop_reasons = list(stop_reasons)
        self.generate = self  # server.generate.remote(...)

    async def remote(self, request_id: str, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        self.seen.append(request_id)
        reason = self.stop_reasons.pop(0) if len(self.stop_reasons) > 1 else self.stop_reasons[0]
        return TokenOutput(
            token_ids=[7, 8, 9], log_probs=[-0.1, -0.2, -0.3], stop_reason=reason, extra_fields={"global_steps": 1}
        )


def _fully_async_client():
    """verl's FullyAsyncLLMServerClient (llm_server.py from 0.9.0, the fully-async rollouter in 0.8.0)."""
    try:
        from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient

        return FullyAsyncLLMServerClient
    except ImportError:
        pass
    try:
        from verl.experimental.fully_async_policy.fully_async_rollouter import FullyAsyncLLMServerClient

        return FullyAsyncLLMServerClient
    except ImportError:
        return None


def _client(cls, server: StandInServer, config: dict):
    from omegaconf import OmegaConf

    client = cls.__new__(cls)  # no Ray actors: only the generate method is exercised
    client.config = OmegaConf.create(config)

    async def acquire(request_id, **_):
        return "server-0", server

    client._acquire_server = acquire
    client._release_server = lambda *args, **kwargs: None
    return client


def run_request_id() -> dict:
    import verl

    if (Path(verl.__file__).parent / "workers" / "rollout" / "llm_server.py").is_file():  # 0.8.0+
        from verl.workers.rollout.llm_server import LLMServerClient as Client
    else:  # 0.7.1
        from verl.experimental.agent_loop.agent_loop import AsyncLLMServerManager as Client

    rollout = {"name": "vllm", "full_determinism": False, "response_length": 16}
    server = StandInServer()
    client = _client(Client, server, {"actor_rollout_ref": {"rollout": rollout}})
    outputs = []
    for turn in range(2):
        output = asyncio.run(
            client.generate(f"caller-{turn}", prompt_ids=[1, 2, 3], sampling_params={"temperature": 1.0})
        )
        outputs.append(dict(output.extra_fields))
    result = {
        "client": f"{Client.__module__}.{Client.__qualname__}",
        "server_saw": server.seen,
        "extra_fields": outputs,
    }
    fully_async = _fully_async_client()
    if fully_async is not None:  # a partial rollout: aborted once, then resumed to completion
        server = StandInServer(("aborted", "completed"))
        config = {"actor_rollout_ref": {"rollout": rollout}, "async_training": {"partial_rollout": True}}
        client = _client(fully_async, server, config)
        output = asyncio.run(client.generate("caller-a", prompt_ids=[1, 2], sampling_params={"max_tokens": 16}))
        result["fully_async"] = {"server_saw": server.seen, "extra_fields": dict(output.extra_fields)}
    return result


def _trainer_source() -> tuple[str, Path]:
    import verl

    path = Path(verl.__file__).parent / "trainer" / "ppo" / "ray_trainer.py"
    return path.read_text(encoding="utf-8"), path


def _inserted_trim_statements(tree: ast.Module) -> list[ast.stmt]:
    """The statements right before `with marked_timer("old_log_prob", ...)` in RayPPOTrainer.fit."""
    trainer = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RayPPOTrainer")
    fit = next(n for n in trainer.body if isinstance(n, ast.FunctionDef) and n.name == "fit")
    for node in ast.walk(fit):
        for field in ("body", "orelse"):
            stmts = getattr(node, field, None)
            if not isinstance(stmts, list):
                continue
            for i, stmt in enumerate(stmts):
                if isinstance(stmt, ast.With) and "old_log_prob" in ast.unparse(stmt.items[0]):
                    return stmts[max(0, i - 2) : i]
    raise LookupError("no old_log_prob block in RayPPOTrainer.fit")


def run_trim() -> dict:
    source, path = _trainer_source()
    tree = ast.parse(source, filename=str(path))
    trainer = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RayPPOTrainer")
    # The methods the patch adds: the trim and the shared switch reader's (`_rlprobe_*`).
    added = [
        n
        for n in trainer.body
        if isinstance(n, ast.FunctionDef) and (n.name == "_prompts_only_batch" or n.name.startswith("_rlprobe_"))
    ]
    namespace: dict = {"os": os, "torch": torch}
    exec(compile(ast.Module(body=added, type_ignores=[]), str(path), "exec"), namespace)
    statements = _inserted_trim_statements(tree)
    hook = compile(ast.Module(body=statements, type_ignores=[]), str(path), "exec")
    Trainer = type("Trainer", (), {n.name: namespace[n.name] for n in added})  # stand-in: the added methods

    result: dict = {"hook_source": [ast.unparse(s) for s in statements], "cases": {}}
    for dims in (2, 3):
        batch = make_batch(dims)
        before = {k: batch.batch[k].clone() for k in batch.batch.keys()}
        scope = {"self": Trainer(), "batch": batch, "os": os}
        exec(hook, scope)  # the inserted statements, as written in the patched fit
        out = scope["batch"]
        result["cases"][f"{dims}d"] = {
            "shapes": shapes(out),
            "input_ids_equal_prompt": torch.equal(out.batch["input_ids"], before["input_ids"][:, :PROMPT]),
            "position_ids_equal_prompt": torch.equal(out.batch["position_ids"], before["position_ids"][..., :PROMPT]),
            "untouched": all(torch.equal(out.batch[k], before[k]) for k in before),
        }
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["guards", "request-id", "trim"])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        result = {"guards": run_guards, "request-id": run_request_id, "trim": run_trim}[args.what]()
        result["ok"] = True
    except Exception:
        result = {"ok": False, "error": traceback.format_exc()}
    args.out.write_text(json.dumps(result, indent=2, default=str))
    return 0 if result["ok"] else 1


def preload() -> None:
    """What verl's modules import, where this venv has it (torch is imported above): `--runs` imports them once
    for all the runs; verl itself, patched or not, is imported by each run."""
    import importlib
    import importlib.util

    for name in ("numpy", "tensordict", "transformers", "omegaconf", "ray", "fastapi"):
        if importlib.util.find_spec(name) is not None:
            importlib.import_module(name)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--runs"]:  # several runs, the imports once (tests/runtime/forked_runs.py)
        from forked_runs import run_forked

        sys.exit(run_forked(Path(sys.argv[2]), preload, main))
    sys.exit(main())
