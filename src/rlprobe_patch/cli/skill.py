"""The skill's own checkers, `check-engine-patch` and `check-consistency-patch`: same rules, wording and exit codes."""

from __future__ import annotations

from pathlib import Path

import click

from rlprobe_patch.cli.output import skill_report


@click.command("check-engine-patch")
@click.option("--verl-root", type=click.Path(path_type=Path), required=True)
@click.option("--backend", type=click.Choice(["fsdp", "megatron"]), required=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of the skill's lines.")
def check_engine_patch_cmd(verl_root: Path, backend: str, as_json: bool) -> None:
    """The skill's check-engine-patch, same markers, wording and exit codes (0 PASS, 1 FAIL)."""
    from rlprobe_patch.core.skill_checks import check_engine_patch

    skill_report(check_engine_patch(verl_root, backend), as_json)


@click.command("check-consistency-patch")
@click.option("--verl-root", type=click.Path(path_type=Path), required=True)
@click.option("--backend", type=click.Choice(["fsdp", "megatron"]), default="fsdp", show_default=True)
@click.option("--vllm-ascend-root", default="", help="Also check the vLLM-Ascend DispatchLogger files.")
@click.option("--skip-vllm", is_flag=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of the skill's lines.")
def check_consistency_patch_cmd(
    verl_root: Path, backend: str, vllm_ascend_root: str, skip_vllm: bool, as_json: bool
) -> None:
    """The skill's check-consistency-patch: same rules, PASS/FAIL/INFO wording and exit codes."""
    from rlprobe_patch.core.skill_checks import check_consistency_patch

    found = check_consistency_patch(verl_root, backend, Path(vllm_ascend_root) if vllm_ascend_root else None, skip_vllm)
    skill_report(found, as_json)
