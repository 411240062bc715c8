"""What to run after a report: the `next:` lines of the summary and the page's "What next".

Each step is (what it is for, its command lines). A command is one the report can write in full: the
inputs, the output folder, the launch script it was given. Where it cannot know a value (the run's launch
script without `--replay-script`, the collection run's dump folder, the training environment's Python),
the command names a placeholder in capitals and the text defines it: `(where RUN.sh is ...; DUMP is ...)`.
Every command line is an `rlprobe-patch` command, except the training run itself, which is the user's
(`bash RUN.sh ...`); the tests run each one as printed, the placeholders filled in.
"""

from __future__ import annotations

import shlex
from typing import Any

from rlprobe_patch.catalogue.releases import releases
from rlprobe_patch.report.build import RUN_DEFINITION, RUN_PLACEHOLDER

DUMP_DEFINITION = "DUMP is the collection run's dump folder (DUMP/actor and DUMP/generate: each side's dump_path)"
PYTHON_DEFINITION = "PYTHON is the training environment's Python, with msprobe"
VERL_DEFINITION = "VERL is the run's verl checkout"


def _where(*definitions: str) -> str:
    return f" (where {'; '.join(definitions)})"


def report_command(report: dict[str, Any], *extra: str, compare: str | None = None) -> str:
    """This report's command again (its inputs, output folder, baseline, launch script), with `extra` options
    and, when given, the compare folder `compare` as one more input."""
    inputs = report.get("inputs") or {}
    words = ["rlprobe-patch", "report", *inputs.get("given", []), *([compare] if compare else [])]
    if inputs.get("output"):
        words += ["-o", inputs["output"]]
    if inputs.get("baseline"):
        words += ["--baseline", inputs["baseline"]]
    if inputs.get("replay_script") and "--replay-script" not in extra:
        words += ["--replay-script", inputs["replay_script"]]
    return shlex.join([*words, *extra])


def next_steps(report: dict[str, Any]) -> list[tuple[str, str]]:
    """What to run next, as (what it is for, the command lines): replay the worst requests, the layer compare,
    the runs that would confirm the diagnosis."""
    steps: list[tuple[str, str]] = []
    replay = report.get("replay") or {}
    script = (report.get("inputs") or {}).get("replay_script")
    if replay.get("command"):
        defined = "" if script else _where(RUN_DEFINITION)
        steps.append(
            (
                f"replay the {len(replay['requests'])} worst request(s) through one collection run that dumps both "
                f"sides (the prompts are in {replay['prompts']}){defined}",
                replay["command"],
            )
        )
    elif replay.get("why_not"):
        ranked = (report.get("tokens") or {}).get("requests", [])[: len(replay["requests"])]
        if any(r["dataset_index"] is not None and r["dataset_index"] >= 0 for r in ranked):
            steps.append(
                (
                    "replay: give the run's dataset, so the worst requests' rows are taken by their dataset index"
                    + _where(*([] if script else [RUN_DEFINITION]), "TRAIN.jsonl is the run's dataset as JSON lines"),
                    report_command(
                        report,
                        "--top",
                        str(len(ranked)),
                        "--replay-script",
                        script or RUN_PLACEHOLDER,
                        "--data",
                        "TRAIN.jsonl",
                    ),
                )
            )
        else:
            run = script or RUN_PLACEHOLDER
            steps.append(
                (
                    "replay: this capture keeps no prompt and no dataset index; capture the run with "
                    "verl.logprob-capture, which keeps both where verl's batch has them, and report again"
                    + _where(VERL_DEFINITION, *([] if script else [RUN_DEFINITION])),
                    "rlprobe-patch apply --verl-root VERL --backend fsdp --only "
                    f"{','.join(releases('verl').capture_patches)}\n"
                    f"MISMATCH_ON=1 MISMATCH_DIR=caps bash {shlex.quote(run)} "
                    "actor_rollout_ref.rollout.calculate_log_probs=True",
                )
            )
    layers = report.get("layers")
    # the layer compare as the diagnosis read it (against its own floor: msprobe flags float rounding in some
    # same-weights pairs), else msprobe's own verdicts
    view = (report.get("diagnosis") or {}).get("layers")
    disagreeing = view["disagreeing"] if view else (layers or {}).get("disagreeing_pairs", [])
    if layers and disagreeing:
        common = view["first_common"] if view else layers["first_common_divergence"]
        first = common or "the first module out of the floor in each pair"
        worst = next(p for p in layers["pairs"] if p["label"] == disagreeing[0])
        # a file to read, not a command: the page's module table shows the same rows
        steps.append(
            (
                f"look at {first} first: the earliest module where the two sides part (the page's layer section; "
                "msprobe's rows of the first pair that leaves the floor are in this CSV)",
                worst["path"],
            )
        )
    elif not layers:
        steps.append(
            (
                "layer compare via msprobe: pair each request's rollout prefill with its training micro-batch, "
                "then report both views together" + _where(DUMP_DEFINITION, PYTHON_DEFINITION),
                "rlprobe-patch check-dump --actor DUMP/actor --generate DUMP/generate --compare "
                "--compare-output compare --python PYTHON\n" + report_command(report, compare="compare"),
            )
        )
    top = ((report.get("diagnosis") or {}).get("causes") or [{}])[0]
    has_runs = any(c.cause == top.get("cause") for c in releases("verl").confirms)
    if top and not script and has_runs and top.get("score", 0) > 0:
        steps.append(
            (
                f"confirm {top['cause']}: with the run's launch script the diagnosis names the runs that would "
                f"confirm it, each with one setting changed{_where(RUN_DEFINITION)}",
                report_command(report, "--replay-script", RUN_PLACEHOLDER),
            )
        )
    return steps
