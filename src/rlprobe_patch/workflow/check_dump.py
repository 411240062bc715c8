"""`check-dump`: the dump layout, then the chain that pairs a generate step with an actor step.

msprobe writes `{dump_path}/step{N}/rank{M}/dump.json` (the docs write `step_N/rank_M`; both
are accepted). The patched engine hook adds `{dump_path}/{pid}/update_actor_log.jsonl`, one
line per msprobe step with the request ids of its micro-batch; the vLLM-Ascend DispatchLogger
writes `{dump_path}/{pid}/dispatch_log.jsonl` next to `{dump_path}/{pid}/step{N}/rank{M}/`.

The chain (dump-output-correlation in the skill): a prefill step of the generate side that
served exactly one request -> its request id, without the `-<8 hex>` suffix vLLM >= 0.14
appends -> the actor step whose micro-batch carried that id -> the two `dump.json` files.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlprobe_patch.errors import RefusedError

_STEP = re.compile(r"^step_?(\d+)$")
_RANK = re.compile(r"^(?:rank_?(\d+)|proc(\d+))$")
_VLLM_SUFFIX = re.compile(r"-[0-9a-f]{8}$")


def strip_vllm_suffix(request_id: str) -> str:
    return _VLLM_SUFFIX.sub("", request_id)


@dataclass(frozen=True)
class DumpFile:
    prefix: str  # the folders between the root and step*, e.g. a pid folder, "" for none
    step: int
    rank: int
    path: Path

    def to_json(self) -> dict[str, Any]:
        return {"prefix": self.prefix, "step": self.step, "rank": self.rank, "dump": str(self.path)}


def find_dumps(root: Path) -> tuple[list[DumpFile], list[str]]:
    """Every dump.json at .../step{N}/rank{M}/ under root, and the paths that do not fit the layout."""
    dumps, odd = [], []
    for path in sorted(root.rglob("dump.json")):
        rel = path.relative_to(root).parts
        if len(rel) < 3:
            odd.append(str(path))
            continue
        step_m, rank_m = _STEP.match(rel[-3]), _RANK.match(rel[-2])
        if not step_m or not rank_m:
            odd.append(str(path))
            continue
        rank = int(rank_m.group(1) or 0) if rank_m.group(1) is not None else 0
        dumps.append(DumpFile("/".join(rel[:-3]), int(step_m.group(1)), rank, path))
    return dumps, odd


def read_jsonl(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    lines, problems = [], []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(f"{path}:{number}: not JSON ({exc.msg})")
            continue
        if not isinstance(record, dict):
            problems.append(f"{path}:{number}: not a JSON object")
            continue
        record["_where"] = f"{path}:{number}"
        record["_dir"] = str(path.parent)
        lines.append(record)
    return lines, problems


@dataclass
class DumpReport:
    actor_root: Path
    generate_root: Path | None
    actor_dumps: list[DumpFile] = field(default_factory=list)
    generate_dumps: list[DumpFile] = field(default_factory=list)
    actor_log: list[dict[str, Any]] = field(default_factory=list)
    dispatch_log: list[dict[str, Any]] = field(default_factory=list)
    pairs: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "actor": {
                "root": str(self.actor_root),
                "dumps": len(self.actor_dumps),
                "steps": sorted({d.step for d in self.actor_dumps}),
                "ranks": sorted({d.rank for d in self.actor_dumps}),
                "log_lines": len(self.actor_log),
            },
            "generate": None
            if self.generate_root is None
            else {
                "root": str(self.generate_root),
                "dumps": len(self.generate_dumps),
                "steps": sorted({d.step for d in self.generate_dumps}),
                "ranks": sorted({d.rank for d in self.generate_dumps}),
                "dispatch_lines": len(self.dispatch_log),
            },
            "pairs": self.pairs,
            "problems": self.problems,
            "notes": self.notes,
        }


def check_dumps(actor: Path, generate: Path | None = None) -> DumpReport:
    for label, root in (("--actor", actor), ("--generate", generate)):
        if root is not None and not Path(root).is_dir():
            raise RefusedError(f"{label} {root}: no such directory", hint="pass the dump_path of that side's config")
    report = DumpReport(Path(actor), Path(generate) if generate else None)
    _check_actor(report)
    if generate is not None:
        _check_generate(report)
        _pair(report)
    return report


def _check_actor(report: DumpReport) -> None:
    root = report.actor_root
    report.actor_dumps, odd = find_dumps(root)
    report.problems += [f"dump.json outside the step*/rank*/ layout: {p}" for p in odd]
    if not report.actor_dumps:
        report.problems.append(f"actor: no step{{N}}/rank{{M}}/dump.json under {root} (did the run set DUMP_ON=1?)")
    logs = sorted(root.glob("*/update_actor_log.jsonl")) + sorted(root.glob("update_actor_log.jsonl"))
    if not logs:
        report.problems.append(
            f"actor: no update_actor_log.jsonl under {root}/<pid>/ (written by the patched engine hook: "
            "rlprobe-patch apply --backend ...)"
        )
        return
    by_key = {(d.step, d.rank) for d in report.actor_dumps}
    for log in logs:
        lines, problems = read_jsonl(log)
        report.problems += problems
        report.actor_log += lines
    for record in report.actor_log:
        if not {"step", "rank", "request_ids"} <= record.keys():
            report.problems.append(f"{record['_where']}: missing step, rank or request_ids")
            continue
        if (record["step"], record["rank"]) not in by_key:
            report.problems.append(
                f"{record['_where']}: logged step {record['step']} rank {record['rank']} has no "
                f"step{record['step']}/rank{record['rank']}/dump.json under {root}"
            )
        if not record["request_ids"]:
            report.notes.append(f"{record['_where']}: step {record['step']} carries no request ids")


def _check_generate(report: DumpReport) -> None:
    root = report.generate_root
    assert root is not None
    report.generate_dumps, odd = find_dumps(root)
    report.problems += [f"dump.json outside the step*/rank*/ layout: {p}" for p in odd]
    if not report.generate_dumps:
        report.problems.append(f"generate: no step{{N}}/rank{{M}}/dump.json under {root}")
    logs = sorted(root.glob("*/dispatch_log.jsonl")) + sorted(root.glob("dispatch_log.jsonl"))
    if not logs:
        report.problems.append(
            f"generate: no dispatch_log.jsonl under {root}/<pid>/ (written by the vLLM-Ascend DispatchLogger "
            "patch): request ids cannot be matched"
        )
        return
    for log in logs:
        lines, problems = read_jsonl(log)
        report.problems += problems
        report.dispatch_log += lines


def _pair(report: DumpReport) -> None:
    root = report.generate_root
    assert root is not None
    actor_by_id: dict[str, list[dict[str, Any]]] = {}
    for record in report.actor_log:
        for rid in record.get("request_ids") or []:
            actor_by_id.setdefault(strip_vllm_suffix(str(rid)), []).append(record)
    actor_dumps = {(d.step, d.rank): d for d in report.actor_dumps}
    gen_dumps: dict[tuple[str, Any, Any], DumpFile] = {(d.prefix, d.step, d.rank): d for d in report.generate_dumps}
    singles = 0
    skipped_multi = 0
    for record in report.dispatch_log:
        if record.get("phase") != "prefill":
            continue
        requests = record.get("requests") or []
        if len(requests) != 1:
            skipped_multi += 1
            continue
        singles += 1
        raw_id = str(requests[0].get("request_id", ""))
        rid = strip_vllm_suffix(raw_id)
        prefix = str(Path(record["_dir"]).relative_to(root)) if Path(record["_dir"]) != root else ""
        prefix = "" if prefix == "." else prefix
        gen = gen_dumps.get((prefix, record.get("step"), record.get("rank")))
        if gen is None:
            report.problems.append(
                f"{record['_where']}: prefill step {record.get('step')} rank {record.get('rank')} of {raw_id} has no "
                f"{(prefix + '/') if prefix else ''}step{record.get('step')}/rank{record.get('rank')}/dump.json "
                f"under {root}"
            )
            continue
        matches = actor_by_id.get(rid, [])
        if not matches:
            report.problems.append(
                f"{record['_where']}: request {rid} (sent as {raw_id}) is in no update_actor_log.jsonl line"
            )
            continue
        for actor_record in matches:
            key = (actor_record["step"], actor_record["rank"])
            dump = actor_dumps.get(key)
            if dump is None:
                continue  # reported by _check_actor
            if actor_record.get("num_requests", len(actor_record["request_ids"])) != 1:
                report.notes.append(
                    f"{actor_record['_where']}: actor step {key[0]} holds {actor_record['request_ids']}; "
                    "its dump mixes requests (micro batch size should be 1)"
                )
            report.pairs.append(
                {
                    "request_id": rid,
                    "sent_as": raw_id,
                    "generate": gen.to_json(),
                    "actor": dump.to_json(),
                    "generate_log": record["_where"],
                    "actor_log": actor_record["_where"],
                }
            )
    if skipped_multi:
        report.notes.append(f"{skipped_multi} prefill step(s) served several requests at once: not comparable")
    if report.dispatch_log and not singles:
        report.problems.append("generate: no prefill step served a single request; nothing can be paired")


_COMPARE = r"""
import json, sys, io, contextlib, os
from msprobe.pytorch.compare.pt_compare import pt_compare
pairs = json.loads(sys.argv[1])
results = []
for pair in pairs:
    out = pair["output"]
    os.makedirs(out, exist_ok=True)
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            pt_compare({"npu_path": pair["actor"], "bench_path": pair["generate"],
                        "is_print_compare_log": False}, out)
        files = sorted(f for f in os.listdir(out) if f.endswith((".csv", ".xlsx")))
        results.append({"ok": bool(files), "output": out, "files": files})
    except BaseException as exc:
        results.append({"ok": False, "output": out, "error": f"{type(exc).__name__}: {exc}",
                        "log": buf.getvalue().splitlines()[-5:]})
print(json.dumps(results))
"""


def compare_pairs(report: DumpReport, output: Path, python: str | None) -> list[dict[str, Any]]:
    """msprobe's own compare (actor = target, generate = golden) on each pair, in `python`."""
    from rlprobe_patch.workflow.envprobe import last_json, run_python

    jobs = []
    for index, pair in enumerate(report.pairs):
        name = f"{index:03d}_{re.sub(r'[^A-Za-z0-9_.-]', '_', pair['request_id'])}"
        jobs.append(
            {"actor": pair["actor"]["dump"], "generate": pair["generate"]["dump"], "output": str(output / name)}
        )
    proc = run_python(python, _COMPARE, json.dumps(jobs), timeout=1800)
    for line in reversed(proc.stdout.strip().splitlines()):
        if line.startswith("["):
            results: list[dict[str, Any]] = json.loads(line)
            for pair, result in zip(report.pairs, results):
                pair["compare"] = result
            return results
    last_json(proc, "msprobe compare")  # raises with the stderr tail
    return []
