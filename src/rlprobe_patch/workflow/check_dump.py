"""`check-dump`: the dump layout, then the chain that pairs a generate step with an actor step.

msprobe writes `{dump_path}/step{N}/rank{M}/dump.json` (the docs write `step_N/rank_M`; both
are accepted). The patched engine hook adds `{dump_path}/{pid}/update_actor_log.jsonl`, one
line per msprobe step with the request ids of its micro-batch; the vLLM-Ascend DispatchLogger
writes `{dump_path}/{pid}/dispatch_log.jsonl` next to `{dump_path}/{pid}/step{N}/rank{M}/`; the
SGLang one writes `{dump_path}/{pid}/dispatch_log.jsonl` beside SGLang's `{dump_path}/step{N}/rank{M}/`
and names each line's dump (`"dump": "step{N}/rank{M}/dump.json"`, relative to the dump path).

The chain (dump-output-correlation in the skill): a prefill step of the generate side that
served exactly one request -> its request id, without the `-<8 hex>` suffix vLLM >= 0.14
appends and the `_P` / `_D` suffix of prefill/decode disaggregation -> the actor step whose
micro-batch carried that id -> the two `dump.json` files. For SGLang (`"source": "sglang"`
lines): an extend pass of exactly one rid that reused no cached prefix and was not split into
chunks, on a server that is not the decode side of a PD pair; every other prefill is listed in
`unpaired` with the reason. With Megatron pipeline parallelism the actor side has one step per
micro-batch per stage and model chunk, and 1F1B may split one into a forward and a backward step:
a prefill pairs with the step that ran the forward on each stage and chunk (`_forward_steps`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rlprobe_patch.base.errors import RefusedError
from rlprobe_patch.base.interpreter import interpreter, last_json, last_line, msprobe_import, run_probe
from rlprobe_patch.dumps.msprobe import PAIR_FILE
from rlprobe_patch.dumps.request_ids import strip_vllm_suffix
from rlprobe_patch.workflow.slime_dumps import SlimeDebugReport, check_slime_debug, debug_files

_STEP = re.compile(r"^step_?(\d+)$")
_RANK = re.compile(r"^(?:rank_?(\d+)|proc(\d+))$")


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


@dataclass(frozen=True)
class CompareVerdict:
    """msprobe's verdicts over every pair compared: the run agrees only when each pair does."""

    pairs: int
    agree: int
    disagree: int
    unknown: int  # the compare failed, or its result could not be read

    @property
    def ok(self) -> bool:
        return self.pairs > 0 and self.agree == self.pairs

    def summary(self) -> str:
        counts = f"{self.agree} agree, {self.disagree} disagree" + (
            f", {self.unknown} without a verdict" if self.unknown else ""
        )
        return f"{self.pairs} pair(s) compared by msprobe: {counts}"

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, **asdict(self)}


@dataclass
class DumpReport:
    actor_root: Path
    generate_root: Path | None
    actor_dumps: list[DumpFile] = field(default_factory=list)
    generate_dumps: list[DumpFile] = field(default_factory=list)
    actor_log: list[dict[str, Any]] = field(default_factory=list)
    dispatch_log: list[dict[str, Any]] = field(default_factory=list)
    pairs: list[dict[str, Any]] = field(default_factory=list)
    unpaired: list[dict[str, Any]] = field(default_factory=list)  # request, log line, why it has no pair
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    compared: CompareVerdict | None = None  # set by judge_compare after --compare

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
            "unpaired": self.unpaired,
            "problems": self.problems,
            "notes": self.notes,
            "compared": None if self.compared is None else self.compared.to_json(),
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
        _check_paired_dumps(report)
    return report


def _check_paired_dumps(report: DumpReport) -> None:
    """Each dump.json a pair names must be whole: a file cut short (a run killed while msprobe wrote it, a full
    disk) pairs by its path and only msprobe's compare would find it out."""
    named = dict.fromkeys(pair[side]["dump"] for pair in report.pairs for side in ("actor", "generate"))
    for path in named:
        try:
            document = json.loads(Path(path).read_bytes())
        except (OSError, ValueError) as exc:
            why = getattr(exc, "msg", None) or getattr(exc, "strerror", None) or str(exc)
            report.problems.append(f"{path}: not a whole msprobe dump.json ({type(exc).__name__}: {why})")
            continue
        if not isinstance(document, dict) or not isinstance(document.get("data"), dict):
            report.problems.append(f'{path}: not an msprobe dump.json (no "data" object)')


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
    # {dump_path}/{pid}/ (vLLM-Ascend, SGLang), or one more level when --generate holds several
    # servers' dump paths (SGLang prefill/decode).
    logs = sorted(root.glob("dispatch_log.jsonl")) + sorted(root.glob("*/dispatch_log.jsonl"))
    logs += sorted(root.glob("*/*/dispatch_log.jsonl"))
    if not logs:
        report.problems.append(
            f"generate: no dispatch_log.jsonl under {root}/<pid>/ (written by the vLLM-Ascend or SGLang "
            "DispatchLogger patch: rlprobe-patch apply --mode consistency): request ids cannot be matched"
        )
        return
    for log in logs:
        lines, problems = read_jsonl(log)
        report.problems += problems
        report.dispatch_log += lines


def _prefix_of(record: dict[str, Any], root: Path) -> str:
    prefix = str(Path(record["_dir"]).relative_to(root)) if Path(record["_dir"]) != root else ""
    return "" if prefix == "." else prefix


def _vllm_prefill_ids(record: dict[str, Any]) -> list[str] | None:
    """The requests a vLLM(-Ascend) step prefilled: the DispatchLogger's `prefill_request_ids`
    (`request_ids` when absent), or the skill's `requests` list; None for a decode step. A step
    whose dump msprobe cut down to one request (`dumped_request_id`, msprobe's `request_id`
    field: community vLLM's logger) holds that request alone, or nothing to pair where it decoded."""
    if record.get("phase") not in ("prefill", "mixed"):
        return None
    if "requests" in record:
        return [str(r.get("request_id", "")) for r in record.get("requests") or []]
    ids = [str(r) for r in record.get("prefill_request_ids") or record.get("request_ids") or []]
    dumped = record.get("dumped_request_id")
    if dumped is not None:
        return [str(dumped)] if str(dumped) in ids else None
    return ids


def _vllm_dump(report: DumpReport, record: dict[str, Any], root: Path) -> DumpFile | None:
    """The dump a vLLM(-Ascend) log line describes: its `dump` (relative to the log's dump path,
    community vLLM), else `{pid}/step{N}/rank{M}` beside the log (vLLM-Ascend)."""
    if record.get("dump"):
        where = Path(record["_dir"]).parent / str(record["dump"])
        return next((d for d in report.generate_dumps if d.path == where), None)
    prefix = _prefix_of(record, root)
    return next(
        (
            d
            for d in report.generate_dumps
            if (d.prefix, d.step, d.rank) == (prefix, record.get("step"), record.get("rank"))
        ),
        None,
    )


def _unpaired(report: DumpReport, record: dict[str, Any], rid: str | None, reason: str) -> None:
    report.unpaired.append({"request_id": rid, "generate_log": record["_where"], "reason": reason})


def _sglang_single(
    report: DumpReport, record: dict[str, Any], chunks: dict[tuple[Any, ...], int]
) -> tuple[str, DumpFile | None] | None:
    """The one request of an SGLang prefill pass and its dump, or None (listed as unpaired)."""
    if record.get("phase") != "prefill":
        return None  # decode, mixed, speculative passes: nothing to pair, not a loss either
    if record.get("pd_role") == "decode":
        return None  # the decode server of a PD pair: its prefill ran on the prefill server
    rids = record.get("rids")
    if rids is None:
        why = (
            "no rids in the log line (the pass's batch carried no request ids: an SGLang release whose model "
            "runner gets none, patched without sglang.dispatch-logger's scheduler site, or a speculative-decoding "
            "batch there)"
        )
        _unpaired(report, record, None, why)
        return None
    if len(rids) != 1:
        for rid in rids:
            _unpaired(
                report,
                record,
                str(rid),
                f"batched prefill of {len(rids)} requests in one pass: its dump mixes them "
                "(one request per prefill pass: rlprobe-patch script --mode consistency)",
            )
        return None
    rid = str(rids[0])
    prefix = (record.get("prefix_lens") or [0])[0]
    if prefix:
        _unpaired(
            report,
            record,
            rid,
            f"the pass reused {prefix} cached prefix token(s) (radix cache, or a resumed request): its dump "
            "covers only the rest of the prompt (disable_radix_cache=True)",
        )
        return None
    count = chunks[(record.get("_dir"), record.get("rank"), rid)]
    if count > 1:
        _unpaired(
            report,
            record,
            rid,
            f"prefilled in {count} chunks (chunked prefill): no single dump holds the prompt (chunked_prefill_size=-1)",
        )
        return None
    root = report.generate_root
    where = Path(record["_dir"]).parent / str(record.get("dump", ""))
    dump = next((d for d in report.generate_dumps if d.path == where), None)
    if dump is None:
        report.problems.append(
            f"{record['_where']}: prefill step {record.get('step')} rank {record.get('rank')} of {rid} has no "
            f"{where.relative_to(root) if root is not None and root in where.parents else where}"
        )
    return rid, dump


def _pair(report: DumpReport) -> None:
    root = report.generate_root
    assert root is not None
    actor_by_id: dict[str, list[dict[str, Any]]] = {}
    for record in report.actor_log:
        for rid in record.get("request_ids") or []:
            for spelling in {str(rid), strip_vllm_suffix(str(rid))}:  # as sent, and as vLLM's base id
                actor_by_id.setdefault(spelling, []).append(record)
    actor_dumps = {(d.step, d.rank): d for d in report.actor_dumps}
    chunks: dict[tuple[Any, ...], int] = {}
    for record in report.dispatch_log:  # an SGLang request prefilled over several passes
        if record.get("source") == "sglang" and record.get("phase") == "prefill":
            for rid in record.get("rids") or []:
                chunk = (record.get("_dir"), record.get("rank"), str(rid))
                chunks[chunk] = chunks.get(chunk, 0) + 1
    skipped_multi = 0
    for record in report.dispatch_log:
        if record.get("source") == "sglang":
            found = _sglang_single(report, record, chunks)
            if found is None or found[1] is None:
                continue
            raw_id, sglang_dump = found
            if sglang_dump is None:
                continue
            gen: DumpFile = sglang_dump
            rid = raw_id
        else:
            ids = _vllm_prefill_ids(record)
            if ids is None:
                continue
            sliced = record.get("dumped_request_id") is not None
            if len(ids) != 1:
                skipped_multi += 1
                for raw in ids:
                    _unpaired(
                        report,
                        record,
                        raw,
                        f"batched prefill of {len(ids)} requests in one step: its dump mixes them (msprobe's "
                        "request_id dumps one request's rows: rlprobe-patch config --request-id)",
                    )
                continue
            if record.get("phase") == "mixed" and not sliced:
                decoding = len(record.get("request_ids") or []) - 1
                _unpaired(
                    report,
                    record,
                    ids[0],
                    f"prefilled in one step with {decoding} decoding request(s): its dump mixes them (msprobe's "
                    "request_id dumps one request's rows: rlprobe-patch config --request-id)",
                )
                continue
            raw_id = ids[0]
            rid = strip_vllm_suffix(raw_id)
            vllm_dump = _vllm_dump(report, record, root)
            if vllm_dump is None:
                prefix = _prefix_of(record, root)
                named = record.get("dump") or (
                    f"{(prefix + '/') if prefix else ''}step{record.get('step')}/rank{record.get('rank')}/dump.json"
                )
                report.problems.append(
                    f"{record['_where']}: prefill step {record.get('step')} rank {record.get('rank')} of {raw_id} "
                    f"has no {named} under {root}"
                )
                continue
            gen = vllm_dump
        matches = actor_by_id.get(raw_id) or actor_by_id.get(rid, [])
        if not matches:
            reason = f"request {rid} (sent as {raw_id}) is in no update_actor_log.jsonl line"
            if record.get("source") == "sglang":
                # Not an error by itself: a resumed rollout is a new SGLang request; the actor keeps the first id.
                reason += " (an aborted and resumed request? the actor keeps the first id)"
                _unpaired(report, record, rid, reason)
            else:
                report.problems.append(f"{record['_where']}: {reason}")
            continue
        for actor_record, dump in _forward_steps(report, record, rid, matches, actor_dumps):
            key = (actor_record["step"], actor_record["rank"])
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
                    **_stage_of(actor_record),
                }
            )
    backward_only = [r for r in report.actor_log if not _holds_forward(r)]
    if backward_only:
        report.notes.append(
            f"{len(backward_only)} actor step(s) hold only the backward of their micro-batch (pipeline stages "
            "before the last, 1F1B): never paired, a prefill dump has no backward"
        )
    if skipped_multi:
        report.notes.append(f"{skipped_multi} prefill step(s) served several requests at once: not comparable")
    if report.dispatch_log and not report.pairs:
        why = "; ".join(sorted({u["reason"] for u in report.unpaired})[:3])
        report.problems.append(
            "generate: no prefill step could be paired with an actor step" + (f" ({why})" if why else "")
        )


_STAGE_KEYS = ("phase", "micro_batch", "pp_rank", "vp_stage", "passes")


def _holds_forward(record: dict[str, Any]) -> bool:
    """Whether the actor step ran its micro-batch's forward: a line without `passes` (one step per
    micro-batch, forward to backward) does; with pipeline parallelism a stage before the last may
    split a micro-batch into a forward step and a backward step (`passes: ["backward"]`)."""
    passes = record.get("passes")
    return not isinstance(passes, list) or "forward" in passes


def _stage_of(record: dict[str, Any]) -> dict[str, Any]:
    """The Megatron hooks' labels of an actor step (phase, micro-batch, pipeline stage, chunk, passes)."""
    return {key: record[key] for key in _STAGE_KEYS if key in record}


def _forward_steps(
    report: DumpReport,
    record: dict[str, Any],
    rid: str,
    matches: list[dict[str, Any]],
    actor_dumps: dict[tuple[Any, Any], DumpFile],
) -> list[tuple[dict[str, Any], DumpFile]]:
    """The actor steps a prefill of `rid` pairs with, one per micro-batch pass on each pipeline stage
    and model chunk: the step that ran the micro-batch's forward (msprobe compares forward outputs,
    and a prefill dump holds only a forward). A step holding only the backward of a split micro-batch
    never pairs; a micro-batch whose forward step has no dump there is listed as unpaired."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for actor_record in {id(r): r for r in matches}.values():  # a line listed under both spellings: once
        labels = tuple(repr(actor_record.get(k)) for k in ("pp_rank", "vp_stage", "phase", "micro_batch"))
        key = (actor_record.get("_dir"), actor_record.get("rank"), *labels)
        groups.setdefault(key, []).append(actor_record)
    found = []
    for group in groups.values():
        forward = [r for r in group if _holds_forward(r)]
        dumped = [(r, actor_dumps[(r["step"], r["rank"])]) for r in forward if (r["step"], r["rank"]) in actor_dumps]
        found += dumped
        backward = [r for r in group if not _holds_forward(r)]
        if dumped or not backward:
            continue  # a forward step without its dump.json is reported by _check_actor
        line = backward[0]
        where = f"pipeline stage {line.get('pp_rank')}" + (
            f" chunk {line.get('vp_stage')}" if line.get("vp_stage") is not None else ""
        )
        missing = (
            f"its forward step {forward[0]['step']} has no dump.json"
            if forward
            else "no log line names its forward step (not dumped: msprobe's step list?)"
        )
        _unpaired(
            report,
            record,
            rid,
            f"rank {line.get('rank')} ({where}): step {line['step']} holds only the backward of {line.get('phase')} "
            f"micro-batch {line.get('micro_batch')} and {missing}",
        )
    return found


# vLLM's module tree against transformers' (what verl's FSDP engine runs): the modules whose output
# means the same on both sides, by path under the model (vLLM fuses q/k/v and gate/up, and its
# decoder layers and fused-add norms return (hidden, residual) where transformers adds the residual:
# those have no counterpart and stay unmatched). vLLM's rows are [tokens, ...] where a micro-batch
# of one sequence is [1, tokens, ...]: the compare views the actor's rows without that leading 1.
_VLLM_SAME_AS_HF = re.compile(
    r"^Module\.model\.(embed_tokens|norm|layers\.\d+\.(input_layernorm|post_attention_layernorm|self_attn|"
    r"self_attn\.o_proj|mlp|mlp\.down_proj))\.[A-Za-z0-9_]+\.forward\.(\d+)$"
)
_VLLM_CLASSES = ("VocabParallelEmbedding", "RowParallelLinear", "QKVParallelLinear", "MergedColumnParallelLinear")


def _rows(data: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    """A dump.json's tensor rows: msprobe's row name -> (module key, the tensor's entry), for output.0
    and the parameters."""
    rows: dict[str, tuple[str, dict[str, Any]]] = {}
    for key, entry in data.items():
        if not isinstance(entry, dict):
            continue
        outputs = entry.get("output")
        if isinstance(outputs, list) and outputs and isinstance(outputs[0], dict):
            rows[f"{key}.output.0"] = (key, outputs[0])
        for pname, param in (entry.get("parameters") or {}).items():
            if isinstance(param, dict):
                rows[f"{key}.parameters.{pname}"] = (key, param)
    return rows


def vllm_module_mapping(actor: dict[str, Any], generate: dict[str, Any]) -> dict[str, Any]:
    """msprobe's `data_mapping` (actor row name -> vLLM row name) for a vLLM dump against an actor dump
    of transformers' modules, and the rows left out with why; empty when the generate side is not vLLM's
    module tree (the names then match as they are)."""
    if not any(cls in key for key in generate for cls in _VLLM_CLASSES):
        return {}

    def index(data: dict[str, Any]) -> dict[tuple[str, int, str], tuple[str, dict[str, Any]]]:
        found = {}
        for row, (key, tensor) in _rows(data).items():
            match = _VLLM_SAME_AS_HF.match(key)
            if match:
                found[(match.group(1), int(match.group(3)), row[len(key) + 1 :])] = (row, tensor)
        return found

    gen = index(generate)
    mapping: dict[str, str] = {}
    left_out: dict[str, str] = {}
    for slot, (row, tensor) in sorted(index(actor).items()):
        other = gen.get(slot)
        if other is None:
            continue
        bench, bench_tensor = other
        shape, bench_shape = tensor.get("shape"), bench_tensor.get("shape")
        if shape is not None and bench_shape is not None and list(bench_shape) not in (list(shape), list(shape)[1:]):
            # vLLM on the CPU packs its linear weights for oneDNN and leaves an empty `weight` ([0])
            left_out[row] = f"shape {shape} vs vLLM's {bench_shape} ({bench})"
            continue
        grads = tensor.get("requires_grad"), bench_tensor.get("requires_grad")
        if ".parameters." in row and None not in grads and grads[0] != grads[1]:
            # msprobe fails a row whose requires_grad differs: a trained parameter against an inference one
            left_out[row] = (
                f"requires_grad {grads[0]} vs vLLM's {grads[1]} ({bench}): a training against an inference parameter"
            )
            continue
        mapping[row] = bench
    return {"data_mapping": mapping, "left_out": left_out}


def require_msprobe(python: str | None) -> None:
    """Refuse `--compare` where msprobe does not import (exit 3), naming the interpreter and why."""
    found = msprobe_import(python)
    if not found["ok"]:
        exe = interpreter(python)
        raise RefusedError(
            f"--compare runs msprobe's compare in {exe}, where msprobe does not import: {found['error']}",
            hint="pass --python with the training environment's interpreter (msprobe and its torch there), or install "
            f"it: rlprobe-patch doctor --install --python {exe}",
        )


def compare_pairs(report: DumpReport, output: Path, python: str | None) -> list[dict[str, Any]]:
    """msprobe's own compare (actor = target, generate = golden) on each pair, in `python`."""
    (results,) = compare_reports([(report, output)], python)
    return results


def compare_reports(items: Sequence[tuple[DumpReport, Path]], python: str | None) -> list[list[dict[str, Any]]]:
    """`compare_pairs` of several reports (each pair's output under its report's folder) in one `python` process:
    msprobe, torch and pandas imported once, not once per report. The results of each report, in order."""
    jobs: list[dict[str, Any]] = []
    left_out: list[dict[str, str]] = []
    for report, output in items:
        for index, pair in enumerate(report.pairs):
            name = f"{index:03d}_{re.sub(r'[^A-Za-z0-9_.-]', '_', pair['request_id'])}"
            job: dict[str, Any] = {
                "actor": pair["actor"]["dump"],
                "generate": pair["generate"]["dump"],
                "output": str(output / name),
            }
            # what the pair is (request, both dumps' step and rank, the actor's micro-batch labels), beside msprobe's
            # CSV, for `report`'s headings
            Path(job["output"]).mkdir(parents=True, exist_ok=True)
            (Path(job["output"]) / PAIR_FILE).write_text(json.dumps(pair, indent=1, default=str), encoding="utf-8")
            mapped = _mapping_for(Path(job["actor"]), Path(job["generate"]))
            if mapped:
                job["data_mapping"] = mapped["data_mapping"]
                # beside the compare output, not in it (`report` reads that folder)
                job["view"] = str(output.parent / f"{output.name}.actor-views" / name)
            left_out.append(mapped.get("left_out", {}))
            jobs.append(job)
    proc = run_probe(python, "msprobe_compare", timeout=1800, stdin=json.dumps(jobs))
    results = last_line(proc, "[")
    if not isinstance(results, list):
        last_json(proc, "msprobe compare")  # raises with the stderr tail
        return [[] for _ in items]
    pairs = [pair for report, _ in items for pair in report.pairs]
    for pair, result, skipped in zip(pairs, results, left_out):
        if skipped:
            result["left_out"] = skipped
        pair["compare"] = result
    split, start = [], 0
    for report, _ in items:
        split.append(results[start : start + len(report.pairs)])
        start += len(report.pairs)
    return split


def _mapping_for(actor: Path, generate: Path) -> dict[str, Any]:
    """The vLLM-to-transformers row mapping of one pair (module_mapping), {} when the names match as they are."""
    try:
        actor_data = json.loads(actor.read_text(encoding="utf-8")).get("data") or {}
        generate_data = json.loads(generate.read_text(encoding="utf-8")).get("data") or {}
    except (OSError, ValueError):
        return {}  # msprobe's compare says what is wrong with the file
    return vllm_module_mapping(actor_data, generate_data)


def judge_compare(report: DumpReport, results: list[dict[str, Any]]) -> CompareVerdict:
    """Record msprobe's verdict on each compared pair in `report`: a pair that disagrees, whose compare
    failed or whose verdict could not be read is a problem (exit 4), since nothing says it agrees."""

    verdict = CompareVerdict(
        pairs=len(results),
        agree=sum(1 for r in results if r.get("ok") and r.get("agree") is True),
        disagree=sum(1 for r in results if r.get("ok") and r.get("agree") is False),
        unknown=sum(1 for r in results if not r.get("ok") or r.get("agree") is None),
    )
    for pair, result in zip(report.pairs, results):
        rid = pair["request_id"]
        if not result.get("ok"):
            report.problems.append(
                f"compare failed for {rid} ({result['output']}): {result.get('error', 'no result file')}"
            )
        elif result.get("agree") is False:
            first = f"; first: {result['mismatched'][0]}" if result.get("mismatched") else ""
            report.problems.append(f"msprobe: {rid} DISAGREES ({result['output']}{first})")
        elif result.get("agree") is None:
            why = result.get("verdict_error") or "no row of the two dumps matched by name"
            report.problems.append(f"msprobe: no verdict for {rid} ({result['output']}): {why}")
    report.compared = verdict
    return verdict


@dataclass(frozen=True)
class CheckDumpRequest:
    """What `check-dump` checks: the actor's dump path, the generate side's, slime's debug dumps, and whether
    msprobe compares each pair (into `compare_output`, in `python`)."""

    actor: Path
    generate: Path | None = None
    slime_debug: tuple[Path, ...] = ()
    compare: bool = False
    compare_output: Path = Path("rlprobe_compare")
    python: str | None = None


@dataclass
class CheckedDumps:
    """`check-dump`'s result: the dump report (with msprobe's verdicts after a compare) and slime's debug dumps."""

    report: DumpReport
    slime: SlimeDebugReport | None = None

    @property
    def ok(self) -> bool:
        return self.report.ok

    def to_json(self) -> dict[str, Any]:
        data = self.report.to_json()
        if self.slime is not None:
            data["slime_debug"] = {"files": self.slime.files, "rollouts": self.slime.rollouts}
        return data


def check_dump(request: CheckDumpRequest, progress: Callable[[str], None] = lambda _: None) -> CheckedDumps:
    """The command as one call: the layout and the pairs, msprobe's compare of each pair where asked (refused
    before anything is written where msprobe does not import in `request.python`), slime's debug dumps tied to
    the actor's log."""
    if request.compare:
        output = request.compare_output
        made = not output.exists()
        output.mkdir(parents=True, exist_ok=True)  # msprobe writes there: refuse now, not per pair
        try:
            require_msprobe(request.python)  # before a pair.json is written: none left by a compare that cannot run
        except RefusedError:
            if made:
                output.rmdir()
            raise
    report = check_dumps(request.actor, request.generate)
    compared: list[dict[str, Any]] = []
    if request.compare and report.pairs:
        progress(f"msprobe compare on {len(report.pairs)} pair(s)")
        compared = compare_pairs(report, request.compare_output, request.python)
    if request.compare:
        judge_compare(report, compared)
    slime = None
    if request.slime_debug:
        slime = check_slime_debug(report.actor_log, debug_files(list(request.slime_debug)), request.python)
        report.problems += slime.problems
        report.notes += slime.notes
    return CheckedDumps(report, slime)
