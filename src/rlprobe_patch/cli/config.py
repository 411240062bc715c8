"""`rlprobe-patch config`: an msprobe config.json for a mode and side, checked by msprobe itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from rlprobe_patch.base.errors import ExitCode, UsageError
from rlprobe_patch.cli.options import python_option
from rlprobe_patch.cli.output import Out, command
from rlprobe_patch.cli.paths import CheckedPath
from rlprobe_patch.workflow.config import (
    LEVELS,
    SIDES,
    TASKS,
    build_config,
    consistency_generate,
    steps_why,
    write_config,
)
from rlprobe_patch.workflow.detect import COLLECTION_MODES
from rlprobe_patch.workflow.pairing import PAIRING


def _int_list(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.replace("[", "").replace("]", "").split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{text!r}: expected comma-separated integers") from None


@click.command("config")
@click.option("--mode", type=click.Choice(COLLECTION_MODES), required=True)
@click.option("--side", type=click.Choice(["actor", "generate", "training"]), help="Default: the mode's first side.")
@click.option("--dump-path", metavar="DIR", help="Required for inference/consistency; forbidden for training.")
@click.option("--level", type=click.Choice(LEVELS), default="mix", show_default=True)
@click.option("--task", type=click.Choice(TASKS), default="statistics", show_default=True)
@click.option("--step", "steps", metavar="N[,N]", help="msprobe steps (default: [0] inference generate, [] otherwise).")
@click.option("--rank", "ranks", metavar="N[,N]", help="msprobe ranks (default: all).")
@click.option(
    "--rollout-backend",
    type=click.Choice(["vllm", "sglang"]),
    help="The rollout engine: the answer lists the engine settings rid pairing needs on the consistency "
    "generate side (which dumps every forward pass, step []).",
)
@click.option(
    "--request-id",
    metavar="ID",
    help="Generate side: dump only this request's rows of each step that holds it (msprobe's request_id; "
    "the id verl sent). Community vLLM's patched model runner hands msprobe the tokens per request.",
)
@click.option("-o", "--output", type=CheckedPath("new-file"), required=True, help="The config.json to write.")
@python_option
@click.option("--no-check", is_flag=True, help="Do not load it with msprobe (when msprobe is not installed here).")
@command
def config_cmd(
    out: Out,
    mode: str,
    side: str | None,
    dump_path: str | None,
    level: str,
    task: str,
    steps: str | None,
    ranks: str | None,
    rollout_backend: str | None,
    request_id: str | None,
    output: Path,
    python: str | None,
    no_check: bool,
) -> int:
    """Write an msprobe config.json for MODE and SIDE, checked by msprobe's own config loading."""

    side = side or SIDES[mode][0]
    data = build_config(
        mode,
        side,
        dump_path,
        level=level,
        task=task,
        steps=_int_list(steps),
        ranks=_int_list(ranks),
        rollout_backend=rollout_backend,
        request_id=request_id,
    )
    checked = write_config(data, output, python, check=not no_check)
    needs: list[dict[str, Any]] = []
    if consistency_generate(mode, side) and rollout_backend in PAIRING:
        needs = [{"key": s.key, "value": s.value, "why": s.why} for s in PAIRING[rollout_backend]]
        needs.append({"key": "step", "value": data["step"], "why": steps_why(rollout_backend)})
    out.emit(
        {
            "ok": True,
            "output": str(output),
            "mode": mode,
            "side": side,
            "rollout_backend": rollout_backend,
            "config": data,
            "msprobe_check": checked,
            "pairing_needs": needs,
        }
    )
    out.line(f"wrote {output} ({mode}, {side} side, level {level})", fg="green")
    if needs:
        out.line(f"step {data['step']}: {needs[-1]['why']}")
        engine = {"sglang": "SGLang server", "vllm": "vLLM engine"}[str(rollout_backend)]
        out.line(f"the {engine} also needs, for check-dump to pair its prefills by rid (script --mode consistency):")
        for need in needs[:-1]:
            out.line(f"    {need['key']}={need['value']}: {need['why']}")
    if checked:
        out.line(
            f"msprobe {checked.get('msprobe')} loads it: task {checked['task']}, level {checked['level']}, "
            f"step {checked['step']}, rank {checked['rank']}"
        )
    else:
        out.line("not checked with msprobe (--no-check)", fg="yellow")
    return int(ExitCode.OK)
