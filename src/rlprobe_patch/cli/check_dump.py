"""`rlprobe-patch check-dump`: the dump layout, the pairs of generate and actor steps, msprobe's compare of each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from rlprobe_patch.base.errors import ExitCode, UsageError
from rlprobe_patch.cli.options import python_option
from rlprobe_patch.cli.output import Out, command
from rlprobe_patch.cli.paths import CheckedPath
from rlprobe_patch.workflow.check_dump import CheckDumpRequest, CheckedDumps, check_dump


@click.command("check-dump")
@click.option("--actor", type=CheckedPath("dir"), required=True, help="dump_path of the actor config.")
@click.option("--generate", type=CheckedPath("dir"), help="dump_path of the generate config.")
@click.option(
    "--slime-debug",
    "slime_debug",
    multiple=True,
    type=CheckedPath("file-or-dir"),
    help="slime's --save-debug-rollout-data / --save-debug-train-data files (or a folder of them); repeatable. "
    "Read with torch in --python.",
)
@click.option("--compare", is_flag=True, help="Run msprobe's compare on each pair (in --python).")
@click.option("--compare-output", type=CheckedPath("new-dir"), default=Path("rlprobe_compare"), show_default=True)
@python_option
@command
def check_dump_cmd(
    out: Out,
    actor: Path,
    generate: Path | None,
    slime_debug: tuple[Path, ...],
    compare: bool,
    compare_output: Path,
    python: str | None,
) -> int:
    """Check the dump layout and pair generate and actor dumps through the request ids (exit 4 on problems;
    with --compare, also when a pair disagrees or has no verdict)."""

    if compare and not generate:
        raise UsageError("--compare needs --generate")
    request = CheckDumpRequest(actor, generate, slime_debug, compare, compare_output, python)
    checked = check_dump(request, out.progress)
    out.emit(checked.to_json())
    _print_checked(out, checked, actor, generate)
    return int(ExitCode.OK if checked.ok else ExitCode.VERIFY_FAILED)


def _print_checked(out: Out, checked: CheckedDumps, actor: Path, generate: Path | None) -> None:
    """The text: each side's dumps, the pairs with msprobe's verdicts, the unpaired, slime's dumps, the notes and
    problems, and the verdict as the last line."""
    report, slime, data = checked.report, checked.slime, checked.report.to_json()
    a = data["actor"]
    out.line(
        f"actor: {a['dumps']} dump(s), steps {a['steps']}, ranks {a['ranks']}, {a['log_lines']} log line(s)", bold=True
    )
    if data["generate"]:
        g = data["generate"]
        out.line(
            f"generate: {g['dumps']} dump(s), steps {g['steps']}, ranks {g['ranks']}, "
            f"{g['dispatch_lines']} dispatch line(s)",
            bold=True,
        )
    for pair in report.pairs:
        # the actor's pipeline stage and model chunk, when its hook names them (Megatron PP / VPP)
        stage = ", ".join(f"{key} {pair[key]}" for key in ("pp_rank", "vp_stage") if pair.get(key) is not None)
        out.line(
            f"  {pair['request_id']}: generate {pair['generate']['dump']}  <->  actor {pair['actor']['dump']}"
            + (f" [{stage}]" if stage else ""),
            fg="green",
        )
        if "compare" in pair:
            result = pair["compare"]
            out.line(f"      compare: {result['output']} {result.get('files', '')}")
            if result.get("agree") is not None:
                verdict = "agree" if result["agree"] else "DISAGREE"
                where = ": " + ", ".join(result["mismatched"]) if result["mismatched"] else ""
                out.line(
                    f"      msprobe: {verdict} ({result['matched']} of {result['rows']} rows matched; "
                    f"Result {result['results']}, accuracy reached {result.get('accuracy_reached')}){where}",
                    fg="green" if result["agree"] else "red",
                )
    for item in report.unpaired:
        out.line(f"  unpaired: {item['request_id'] or '-'} ({item['generate_log']}): {item['reason']}", fg="yellow")
    if slime is not None:
        _print_slime_debug(out, slime)
    for note in report.notes:
        out.line(f"note: {note}", fg="yellow")
    for problem in report.problems:
        out.line(f"FAIL: {problem}", fg="red")
    verdict = "dumps OK" if report.ok else "dump check FAILED"
    if report.compared is not None:  # the last line: what was compared, and msprobe's verdict
        verdict = f"{report.compared.summary()} ({actor} vs {generate}): {'OK' if report.ok else 'FAILED'}"
    out.line(verdict, fg="green" if report.ok else "red", bold=True)


def _print_slime_debug(out: Out, slime: Any) -> None:
    out.line(f"slime debug dumps: {len(slime.files)} file(s)", bold=True)
    for entry in slime.rollouts:
        name = f"eval rollout {entry['rollout_id']}" if entry["evaluation"] else f"rollout {entry['rollout_id']}"
        out.line(f"  {name}:")
        for dump in entry["rollout_dumps"]:
            ids = [ids[0] if ids else "-" for ids in dump["request_ids"].values()]
            out.line(f"    rollout data {dump['path']}: {dump['samples']} sample(s) {dump['sample_indices']} ids {ids}")
        for dump in entry["train_dumps"]:
            out.line(
                f"    train data (format {dump['format_version']}, rank {dump['rank']}) {dump['path']}: "
                f"samples {dump['sample_indices']}"
                + (f", {len(dump['dp_shards'])} dp shard(s)" if "dp_shards" in dump else "")
            )
        for step in entry.get("actor_steps", []):
            out.line(
                f"    actor {step['phase']} step {step['step']} rank {step['rank']}: samples {step['sample_indices']} "
                f"{step['request_ids']}  ({step['log']})",
                fg="green",
            )
