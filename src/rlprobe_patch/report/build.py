"""`rlprobe-patch report`: read the inputs, compute the numbers, decide the thresholds, write replay files.

Inputs, in any mix (files or folders, found by name): captures (`*.rlprobe-logprobs.npz`),
slime's debug dumps (`*.pt`, read in `--python`), msprobe compare CSVs (`compare_result*.csv`).
"""

from __future__ import annotations

import itertools
import json
import shlex
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from rlprobe_patch.base.errors import RefusedError
from rlprobe_patch.base.fsio import atomic_write
from rlprobe_patch.dumps.msprobe import TENSORS
from rlprobe_patch.report import EncodedList, json_text
from rlprobe_patch.report.capture_format import SUFFIX, TokenBatch, check_finite, read_capture
from rlprobe_patch.report.confirm import ConsistencySettings
from rlprobe_patch.report.diagnosis import Judged, conclude, diagnose, in_step_order, judge_step, make_step
from rlprobe_patch.report.floor import Floor
from rlprobe_patch.report.identity import StepIdentity, check_step, index_records, weights_for_step
from rlprobe_patch.report.layers import PairCompare, compare_files, layer_summary, read_compare_csv
from rlprobe_patch.report.metrics import (
    FloatArray,
    PartSums,
    Profiles,
    Tokens,
    debug_figures,
    dlogp_histogram,
    median,
    parts_offpolicy_metrics,
    scale_figures,
    tokens_offpolicy_metrics,
    tokens_per_request,
)
from rlprobe_patch.report.rollout_record import SUFFIX as RECORD_SUFFIX
from rlprobe_patch.report.rollout_record import RolloutRecord, read_records
from rlprobe_patch.report.verdict import grade_steps, guidance_state, verdict
from rlprobe_patch.report.weights import SUFFIX as WEIGHTS_SUFFIX
from rlprobe_patch.report.weights import Weights, read_weights

# the launch script in a printed command when the report was given none (`--replay-script`); the text defines it
RUN_PLACEHOLDER = "RUN.sh"
RUN_DEFINITION = "RUN.sh is the run's launch script (report --replay-script names it)"

REPORT_FORMAT = "rlprobe-report"
REPORT_VERSION = 1

# option name -> (the report's number it limits, "max" or "min")
THRESHOLDS: dict[str, tuple[str, str]] = {
    "max_prob_diff": ("training/rollout_probs_diff_max", "max"),
    "max_prob_diff_mean": ("training/rollout_probs_diff_mean", "max"),
    "max_abs_kl": ("kl", "max-abs"),
    "max_k3_kl": ("k3_kl", "max"),
    "min_pearson_corr": ("training/rollout_actor_probs_pearson_corr", "min"),
    "max_diverging_pairs": ("diverging_pairs", "max"),
}


@dataclass
class Inputs:
    captures: list[Path] = field(default_factory=list)
    slime: list[Path] = field(default_factory=list)
    compares: list[Path] = field(default_factory=list)
    records: list[Path] = field(default_factory=list)  # the rollout engine's (*.rlprobe-rollout.jsonl)
    weights: list[Path] = field(default_factory=list)  # weight fingerprints (*.rlprobe-weights.json)
    # slime dumps found in a folder given (not named): one that is no slime dump is left out with a note
    slime_found: set[Path] = field(default_factory=set)


@dataclass
class Evidence:
    """What the report reads besides the log-probs: the engine's records and both sides' weight fingerprints."""

    records: list[RolloutRecord] = field(default_factory=list)
    training_weights: list[Weights] = field(default_factory=list)
    rollout_weights: list[Weights] = field(default_factory=list)

    def identities(self, batches: list[TokenBatch]) -> dict[int, StepIdentity]:
        """Each batch's identity check (by its index), where records or fingerprints exist."""
        if not self.records and not self.rollout_weights:
            return {}
        by_id = index_records(self.records)
        found = {}
        for index, batch in enumerate(batches):
            identity = check_step(batch, by_id)
            identity.weights = weights_for_step(batch.step, self.training_weights, self.rollout_weights)
            found[index] = identity
        return found


def read_evidence(inputs: Inputs) -> Evidence:
    evidence = Evidence()
    for path in inputs.records:
        evidence.records += read_records(path)
    for path in inputs.weights:
        weights = read_weights(path)
        (evidence.training_weights if weights.side == "training" else evidence.rollout_weights).append(weights)
    return evidence


def classify(paths: list[Path]) -> Inputs:
    """Sort the paths given into captures, slime dumps and compare CSVs; refuse what is none of them. A file
    given twice (itself and in a folder given) is read once."""
    found = Inputs()
    for path in paths:
        if path.is_dir():
            found.captures += sorted(path.rglob(f"*{SUFFIX}"))
            scanned = sorted(p for p in path.rglob("*.pt") if p.is_file() and TENSORS not in p.parts)
            found.slime += scanned
            found.slime_found.update(p.resolve() for p in scanned)
            found.compares += compare_files([path])
            found.records += sorted(p for p in path.rglob(f"*{RECORD_SUFFIX}") if p.is_file())
            found.weights += sorted(p for p in path.rglob(f"*{WEIGHTS_SUFFIX}") if p.is_file())
        elif path.is_file():
            if path.name.endswith(RECORD_SUFFIX):
                found.records.append(path)
            elif path.name.endswith(WEIGHTS_SUFFIX):
                found.weights.append(path)
            elif path.name.endswith(".npz"):
                found.captures.append(path)
            elif path.suffix == ".pt":
                found.slime.append(path)
            elif path.suffix == ".csv":
                found.compares.append(path)
            else:
                raise RefusedError(
                    f"{path}: neither a capture (*{SUFFIX}), a slime debug dump (*.pt), an msprobe compare CSV, a "
                    f"rollout record (*{RECORD_SUFFIX}) nor weight fingerprints (*{WEIGHTS_SUFFIX})"
                )
        else:
            raise RefusedError(f"{path}: no such file or directory")
    found.captures, found.slime, found.compares = (_once(found.captures), _once(found.slime), _once(found.compares))
    found.records, found.weights = _once(found.records), _once(found.weights)
    found.slime_found -= {p.resolve() for p in paths if p.is_file()}  # named: a file that is no dump is refused
    if not (found.captures or found.slime or found.compares):
        raise RefusedError(
            f"nothing to report in {', '.join(map(str, paths))}",
            hint=f"give captures (*{SUFFIX}), slime debug dumps (*.pt) or check-dump --compare's output",
        )
    return found


def _once(paths: list[Path]) -> list[Path]:
    """`paths` without a file seen before under another spelling (a folder given and a file in it)."""
    seen: set[Path] = set()
    kept = []
    for path in paths:
        if path.resolve() not in seen:
            seen.add(path.resolve())
            kept.append(path)
    return kept


SAMPLING_KEYS = ("temperature", "top_p", "top_k", "logprobs_mode")  # under actor_rollout_ref.rollout.
CLIP_KEYS = ("clip_ratio_low", "clip_ratio_high")  # under actor_rollout_ref.actor., verl's facts of the same names


@dataclass
class RunSettings:
    """What the run's launch script sets that the diagnosis reads: the rollout's sampling, PPO's clip range."""

    sampling: dict[str, Any] | None
    clip: tuple[float, float]
    clip_source: str
    note: str = ""


def _clip(values: list[Any]) -> tuple[float, float] | None:
    try:
        low, high = (float(v) for v in values)
    except (TypeError, ValueError):
        return None  # unset, or an interpolation the reader left unresolved
    return low, high


def default_clip() -> tuple[tuple[float, float], str]:
    """verl's default clip range, from the newest tested release's defaults (patches/releases/verl.toml)."""
    from packaging.version import Version

    from rlprobe_patch.catalogue.releases import releases

    verl = releases("verl")
    newest = max(verl.tested, key=Version)
    found = verl.defaults_for(newest)
    defaults = found.defaults if found is not None else {}
    clip = _clip([defaults.get(k) for k in CLIP_KEYS])
    if clip is None:
        raise RuntimeError(f"patches/releases/verl.toml: verl {newest}'s defaults lack {', '.join(CLIP_KEYS)}")
    return clip, f"verl {newest}'s defaults (actor clip_ratio_low / clip_ratio_high)"


def run_settings(script: Path | None, python: str | None = None) -> RunSettings:
    """The rollout's sampling settings (`SAMPLING_KEYS`) and PPO's clip range the launch script sets (its release's
    defaults where it leaves them), with a note where the script cannot be read; verl's defaults without one."""
    clip, clip_source = default_clip()
    if script is None:
        return RunSettings(None, clip, clip_source)
    # imported here: the script reader (bash and Hydra) only where a script is given
    from rlprobe_patch.launch.script import ReaderOptions, read_script

    try:
        read = read_script(script, ReaderOptions(python=python))
    except RefusedError as exc:
        return RunSettings(None, clip, clip_source, f"--replay-script {script}: not read ({exc.message})")
    values = {k: read.value(f"actor_rollout_ref.rollout.{k}") for k in SAMPLING_KEYS}
    sampling = {"source": str(script), **{k: v for k, v in values.items() if v is not None}}
    facts = [read.facts.get(k) for k in CLIP_KEYS]
    found = _clip([f.value if f is not None else None for f in facts])
    if found is not None:
        sources = sorted({f.source for f in facts if f is not None})
        return RunSettings(sampling, found, f"{script} ({'; '.join(sources)})")
    return RunSettings(sampling, clip, clip_source, f"--replay-script {script}: no clip range read; {clip_source}")


def read_baseline(path: Path) -> list[TokenBatch]:
    """`--baseline`: the captures in `path` (a file or a folder), checked as the inputs are."""
    captures = classify([path]).captures
    if not captures:
        raise RefusedError(f"--baseline {path}: no capture (*{SUFFIX}) in it")
    batches = [read_capture(p) for p in captures]
    for batch in batches:
        check_finite(batch)
    return batches


def read_inputs(
    inputs: Inputs, python: str | None, progress: Callable[[str], None] | None = None
) -> tuple[list[TokenBatch], list[PairCompare], list[str]]:
    """The inputs read and checked; `progress` is told each capture read (a run's captures can take a minute). Two
    captures are read at a time (numpy's copies, the CRC checks and the page faults of each new array run outside
    the interpreter's lock), taken in their order: a capture that cannot be read is refused as it would be alone, the
    reads not started cancelled."""
    batches = []
    pool = ThreadPoolExecutor(max_workers=2)
    try:
        for done, batch in enumerate(pool.map(read_capture, inputs.captures), start=1):
            batches.append(batch)
            if progress is not None:
                progress(f"reading captures: {done} of {len(inputs.captures)}")
    finally:
        pool.shutdown(cancel_futures=True)
    notes: list[str] = []
    if inputs.slime:
        # imported here: the slime reader brings the interpreter probe (subprocess and all),
        # which a report of captures alone does not need
        from rlprobe_patch.report.slime_logprobs import join_slime, read_slime_files

        items = []
        try:
            read = read_slime_files(inputs.slime, python)
        except RefusedError as exc:
            found = all(p.resolve() in inputs.slime_found for p in inputs.slime)
            if not found or not (inputs.captures or inputs.compares):
                raise
            # torch files that happen to lie in a folder given, beside the captures or the compare CSVs
            read = []
            notes.append(
                f"{len(inputs.slime)} *.pt file(s) in the folders given left out, not read: {exc.message} "
                f"(if they are slime's debug dumps: {exc.hint})"
            )
        for item in read:
            if "error" in item and Path(item["path"]).resolve() in inputs.slime_found:
                notes.append(f"{item['path']}: left out, not a slime debug dump ({item['error']})")
            else:
                items.append(item)
        slime_batches, slime_notes = join_slime(items)
        batches += slime_batches
        notes += slime_notes
    for batch in batches:
        check_finite(batch)
    pairs = [read_compare_csv(p) for p in inputs.compares]
    notes += [f"{p.info_problem}: the pair is headed by its folder's name only" for p in pairs if p.info_problem]
    return batches, pairs, notes


def step_tokens(batches: list[TokenBatch], pool: Executor | None = None) -> list[Tokens]:
    """Each batch's valid tokens, taken out of its padding: consecutive batches laid end to end in groups of at least
    `GROUP_TOKENS` (`Tokens.join`), each batch a view of its group's arrays (`Tokens.parts`). A group's values are made
    and read while it is near the processor, and its arrays are large enough for numpy to ask the kernel for huge
    pages: the run's values laid end to end were tens of MB each, a pass through memory for every figure, and one
    step's alone a few hundred KB, each faulted in page by page. With `pool`, the groups are laid out side by side in
    its threads."""
    if not batches:
        return []
    groups: list[list[TokenBatch]] = [[]]
    size = 0
    for b in batches:
        if size >= GROUP_TOKENS:
            groups.append([])
            size = 0
        groups[-1].append(b)
        size += int(np.count_nonzero(b.mask))

    def join(group: list[TokenBatch]) -> list[Tokens]:
        return Tokens.join([(b.rollout, b.training, b.mask, b.responses) for b in group]).part_list()

    return [part for parts in (pool.map if pool else map)(join, groups) for part in parts]


_T = TypeVar("_T")

_LEVELS = (0.5, 0.9, 0.99, 0.999, 1.0)  # the |dlogp| quantiles report.json gives
_RUN_VALUES = ("abs_dlogp", "p_rollout")  # the per-token values the run's figures read over every step
GROUP_TOKENS = 2**21  # valid tokens of a group of steps (`step_tokens`): a value's array of 16 MB, on huge pages


# called with each step (its batch's index, the batch, its tokens and its figures) in the thread that took its figures,
# before its per-token values are freed (the report judges the step there)
EachStep = Callable[[int, TokenBatch, Tokens, dict[str, Any]], None]


def token_report(
    batches: list[TokenBatch],
    parts: list[Tokens] | None = None,
    pool: Executor | None = None,
    each_step: EachStep | None = None,
) -> dict[str, Any]:
    """Per step, per request and over the run. Each step's figures are computed over its own tokens (`parts`, else
    `step_tokens(batches)`), and the run's combined from the steps' sums (`PartSums`, `parts_offpolicy_metrics`);
    only the run's |dlogp| distribution and median probability read every token at once. With `pool`, the steps are
    taken side by side in its threads, the distribution and the median beside them (each the same computation as
    alone); each step's requests are encoded with its figures (`EncodedList`: the encoder holds the interpreter's
    lock, numpy's loops do not). `each_step` is called with each step's figures (`EachStep`)."""
    parts = parts if parts is not None else step_tokens(batches)
    # the two values the run reads over every step, first (each group's side by side: neither reads the other), so
    # that its |dlogp| distribution and its median probability are taken beside the steps' figures
    values = [(whole, name) for whole in _wholes(parts) for name in _RUN_VALUES]
    list((pool.map if pool else map)(lambda value: value[0].make(value[1]), values))
    distribution = _later(pool, _distribution, parts)
    median_p = _later(pool, _run_median, parts)
    steps, requests, texts, profiles, sums = _per_step(batches, parts, pool, each_step)
    order = sorted(
        (i for i, r in enumerate(requests) if r["tokens"]),
        key=lambda i: (-requests[i]["max_abs_dp"], -requests[i]["max_abs_dlogp"], requests[i]["request_id"]),
    )
    ranked_texts = []
    for rank, i in enumerate(order, start=1):
        requests[i]["rank"] = rank
        # the rank is the request's last key: its text is the one made with its step, the rank added last, as the
        # encoder writes it
        ranked_texts.append(f'{texts[i][:-1]}, "rank": {rank}}}')
    order += [i for i, r in enumerate(requests) if not r["tokens"]]
    ranked_texts += [texts[i] for i in order[len(ranked_texts) :]]
    ranked = EncodedList([requests[i] for i in order], ranked_texts)
    offpolicy = parts_offpolicy_metrics(parts)
    combined = PartSums.combine(sums)
    overall: dict[str, Any] = debug_figures(combined) | offpolicy
    scale = scale_figures(combined, median_p())
    quantile_values, histogram = distribution()
    size = sum(part.size for part in parts)
    # each step's counts over the run's bins (the page tells the steps apart)
    histogram["steps"] = [
        {"step": s["step"], "kind": s["kind"], **part} for s, part in zip(steps, histogram.pop("parts"))
    ]
    return {
        "samples": len(requests),
        "tokens": size,
        "empty_responses": sum(1 for r in requests if not r["tokens"]),
        "overall": overall,
        "scale": scale,
        "steps": steps,
        "requests": ranked,
        "by_position": profiles.by_position(),
        "by_probability": profiles.by_probability(),
        "by_probability_decade": profiles.by_probability_decade(),
        "abs_dlogp_quantiles": dict(zip(map(str, _LEVELS), quantile_values)) if size else {},
        "abs_dlogp_histogram": histogram,
    }


def _later(pool: Executor | None, work: Callable[..., _T], *args: Any) -> Callable[[], _T]:
    """`work(*args)` in `pool` (its result when asked for), or now without one."""
    if pool is None:
        value = work(*args)
        return lambda: value
    return pool.submit(work, *args).result


def _groups(parts: list[Tokens]) -> list[tuple[Tokens, list[int]]]:
    """The groups `parts` are views of (`Tokens.whole`, consecutive steps), in order: each with its steps' indices."""
    groups: dict[int, tuple[Tokens, list[int]]] = {}
    for index, part in enumerate(parts):
        groups.setdefault(id(part.whole), (part.whole, []))[1].append(index)
    return list(groups.values())


def _wholes(parts: list[Tokens]) -> list[Tokens]:
    """The groups `parts` are views of, each once, in order."""
    return [whole for whole, _ in _groups(parts)]


def _run_values(parts: list[Tokens], name: str) -> FloatArray:
    """The per-token value `name` of every part, laid end to end (the run's, in the steps' order): their groups'."""
    return np.concatenate([whole._get(name) for whole in _wholes(parts)]) if parts else np.zeros(0)


def _run_median(parts: list[Tokens]) -> float:
    return median(_run_values(parts, "p_rollout"))


def _distribution(parts: list[Tokens]) -> tuple[list[float], dict[str, Any]]:
    """|dlogp|'s quantiles over the run, and its histogram with each step's counts (`parts`)."""
    dlogp = _run_values(parts, "abs_dlogp")
    ends = np.cumsum([0] + [part.size for part in parts]).tolist()
    histogram = dlogp_histogram(dlogp, parts=[slice(a, b) for a, b in itertools.pairwise(ends)])
    return (np.quantile(dlogp, _LEVELS).tolist() if dlogp.size else []), histogram


@dataclass(frozen=True)
class _StepFigures:
    step: dict[str, Any]  # the step's entry of report.json
    rows: list[dict[str, Any]]  # its requests' figures
    texts: list[str]  # each request's JSON text (`json_text`), before its rank
    counts: dict[str, Any]  # its share of the profiles
    sums: PartSums


def _per_step(
    batches: list[TokenBatch], parts: list[Tokens], pool: Executor | None = None, each_step: EachStep | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str], Profiles, list[PartSums]]:
    """Each step's metrics, its requests' figures and their texts, the profiles over every step and each step's sums
    (each step's taken apart, in `pool` where given, and gathered in the steps' order)."""

    def figures(index: int) -> _StepFigures:
        taken = _step_figures(batches[index], parts[index])
        if each_step is not None:
            each_step(index, batches[index], parts[index], taken.step)
        # the run reads two values of every step after this (its |dlogp| distribution, its median probability)
        parts[index].forget(*_RUN_VALUES)
        return taken

    taken: list[_StepFigures] = []
    for whole, indices in _groups(parts):
        # the group's per-token values once, before any thread reads them: the probabilities' and the log-ratio's
        # apart, side by side (neither reads the other's)
        probabilities = _later(pool, whole.make, "abs_dp")
        whole.make("abs_dlogp", "k3_terms")
        probabilities()
        taken += (pool.map if pool else map)(figures, indices)
        whole.forget(*_RUN_VALUES)
    profiles = Profiles()
    for each in taken:
        profiles.add_counts(each.counts)
    return (
        [each.step for each in taken],
        [row for each in taken for row in each.rows],
        [text for each in taken for text in each.texts],
        profiles,
        [each.sums for each in taken],
    )


def _step_figures(b: TokenBatch, tokens: Tokens) -> _StepFigures:
    """One step's metrics, its requests' figures and texts, its share of the profiles, and its sums."""
    sums = PartSums.of(tokens)
    metrics: dict[str, Any] = debug_figures(sums)
    metrics.update({f"rollout_corr/{k}": v for k, v in tokens_offpolicy_metrics(tokens).items()})
    step = {
        "step": b.step,
        "kind": b.kind,
        "path": b.path,
        "samples": b.samples,
        "tokens": tokens.size,
        "metrics": metrics,
        "scale": scale_figures(sums, median(tokens.p_rollout)),
    }
    counts = Profiles.count(tokens)
    dataset_index = b.dataset_index.tolist() if b.dataset_index is not None else [None] * b.samples
    rows = tokens_per_request(tokens)
    for i, (row, request_id, index, prompt_length) in enumerate(
        zip(rows, b.request_ids, dataset_index, b.prompt_lengths.tolist())
    ):
        row.update(
            request_id=request_id, step=b.step, kind=b.kind, row=i, dataset_index=index, prompt_length=prompt_length
        )
    return _StepFigures(step, rows, [json_text(row) for row in rows], counts, sums)


def check_thresholds(report: dict[str, Any], limits: dict[str, float | None]) -> list[dict[str, Any]]:
    """One entry per threshold set: the value, the limit, whether it is crossed."""
    values: dict[str, Any] = dict(report["tokens"]["overall"]) if report.get("tokens") else {}
    if report.get("layers"):
        values["diverging_pairs"] = len(report["layers"]["disagreeing_pairs"])
    checks = []
    for option, limit in limits.items():
        if limit is None:
            continue
        key, how = THRESHOLDS[option]
        value = values.get(key)
        if value is None or (isinstance(value, float) and np.isnan(value)):
            crossed = None  # nothing to compare with (no token, no compare)
        elif how == "max":
            crossed = bool(value > limit)
        elif how == "max-abs":
            crossed = bool(abs(value) > limit)
        else:
            crossed = bool(value < limit)
        checks.append(
            {
                "option": "--" + option.replace("_", "-"),
                "metric": key,
                "limit": limit,
                "value": value,
                "crossed": crossed,
            }
        )
    return checks


def build(
    batches: list[TokenBatch],
    pairs: list[PairCompare],
    limits: dict[str, float | None],
    floor: Floor,
    script: str | None = None,
    sampling: dict[str, Any] | None = None,
    evidence: Evidence | None = None,
    clip: tuple[float, float] | None = None,
    *,
    consistency: ConsistencySettings | None = None,
    clip_source: str | None = None,
) -> dict[str, Any]:
    """The report's figures, diagnosis, thresholds and verdict; `floor` is the noise floor the diagnosis judges
    against (`floor.choose_floor`), `evidence` the engine's records and the weight fingerprints, `clip` the
    run's PPO clip range (read from `clip_source`), `consistency` what a consistency script of `script` sets."""
    identities = (evidence or Evidence()).identities(batches)
    judged: dict[int, Judged] = {}

    def judge(index: int, batch: TokenBatch, tokens: Tokens, figures: dict[str, Any]) -> None:
        """The step judged as soon as its figures are taken, while its per-token values are in memory (a step's
        guidance state is its figures' grade, as the verdict's)."""
        state = {index: guidance_state(figures)}
        step = make_step(batch, index, floor, sampling, identities, state, tokens)
        if step is not None:
            judged[index] = judge_step(step, index, state, clip)

    # imported here: threadpoolctl finds the BLAS library numpy loaded (milliseconds), needed only for the fits
    from threadpoolctl import threadpool_limits

    # two threads for the figures and the diagnosis (numpy releases the interpreter's lock in its loops, so they
    # share the machine's cores; every figure is the one a single thread computes; a third thread was slower on two
    # cores at 1M tokens and no faster at 10M); the fits (np.linalg.lstsq, np.dot) on one BLAS thread: a thread pool
    # woken for every step's fit cost more than the fits (2 s of 3 on 10M tokens, 2 cores), and a sum split over
    # threads differs in its last bits with the machine's number of cores
    with ThreadPoolExecutor(max_workers=2) as pool, threadpool_limits(limits=1, user_api="blas"):
        parts = step_tokens(batches, pool)
        # without a layer compare, each step is judged with its figures; with one, the clean steps' requests make
        # the layer floor every step is judged against (`diagnose`: the steps after the figures)
        each_step = judge if batches and not pairs else None
        report: dict[str, Any] = {
            "format": REPORT_FORMAT,
            "format_version": REPORT_VERSION,
            "tokens": token_report(batches, parts, pool, each_step) if batches else None,
            "layers": layer_summary(pairs) if pairs else None,
        }
        grades = grade_steps(report)
        if each_step is not None:
            steps = in_step_order(judged)
            report["diagnosis"] = conclude(
                steps, floor, None, script, sampling, clip, consistency=consistency, clip_source=clip_source
            )
        elif batches:
            # the verdict's step grades are in the batches' order (token_report keeps it)
            by_batch = {index: grade["state"] for index, grade in enumerate(grades)}
            report["diagnosis"] = diagnose(
                batches,
                report["layers"],
                floor,
                script,
                sampling,
                identities,
                by_batch,
                clip,
                parts,
                consistency=consistency,
                clip_source=clip_source,
                pool=pool,
            )
    report["thresholds"] = check_thresholds(report, limits)
    report["verdict"] = verdict(report, grades)
    # the threshold options given decide the exit code; without any, the verdict does
    report["verdict"]["decides_exit"] = not report["thresholds"]
    return report


def replay(
    batches: list[TokenBatch],
    report: dict[str, Any],
    top: int,
    directory: Path,
    script: str | None,
    data: Path | None = None,
) -> dict[str, Any]:
    """The `top` worst requests' prompts, in verl's dataset layout, and the command that collects them.

    A request's row is the run's own data row at the index verl carries (`data`, JSON lines with
    `extra_info.index`, else the line number), else one made from the raw prompt. The requests left
    without a row are named, with why (`why_not`): never nothing written in silence.
    """
    worst = [r for r in report["tokens"]["requests"] if r["tokens"]][:top] if report.get("tokens") else []
    by_key = {(b.step, b.kind, i): (b, i) for b in batches for i in range(b.samples)}
    own = _data_rows(data) if data else {}
    rows = []
    without: dict[str, list[str]] = {}  # why -> the requests it leaves without a row
    for r in worst:
        batch, i = by_key[(r["step"], r["kind"], r["row"])]
        row, why = _replay_row(r, batch.raw_prompts[i] if batch.raw_prompts else "", own, data)
        if row is None:
            without.setdefault(why, []).append(r["request_id"])
        else:
            rows.append(row)
    result: dict[str, Any] = {
        "requests": [r["request_id"] for r in worst],
        "without_prompt": [rid for ids in without.values() for rid in ids],
        "prompts": None,
    }
    if without:
        result["why_not"] = "; ".join(f"{why} ({len(ids)}: {', '.join(ids)})" for why, ids in without.items())
    if not rows:
        return result
    directory.mkdir(parents=True, exist_ok=True)
    prompts = directory / "replay_prompts.jsonl"
    atomic_write(prompts, "".join(json.dumps(row) + "\n" for row in rows).encode())
    result["prompts"] = str(prompts)
    result["overrides"] = [
        f"data.train_files={prompts.absolute()}",
        "data.shuffle=False",
        # one prompt per step in a consistency collection (batch size 1): a step per prompt
        f"trainer.total_training_steps={len(rows)}",
    ]
    run = script or RUN_PLACEHOLDER
    # beside the prompts it replays, in the report's own folder, which each report run writes again: so does the
    # replay script (`--force`: the one a report run before made, never the user's launch script)
    output = directory / "replay.sh"
    sets = [word for override in result["overrides"] for word in ("--set", override)]
    command = ["rlprobe-patch", "script", run, "--mode", "consistency", *sets, "-o", str(output), "--force"]
    result["command"] = shlex.join(command)
    return result


def _replay_row(
    request: dict[str, Any], raw: str, own: dict[int, dict[str, Any]], data: Path | None
) -> tuple[dict[str, Any] | None, str]:
    """One request's replay row (the run's own, else made from the raw prompt), or None and why not."""
    index = request["dataset_index"]
    if index is not None and index >= 0 and index in own:
        return own[index], ""
    if raw:
        try:
            prompt: Any = json.loads(raw)
        except ValueError:
            prompt = raw
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        extra = {"index": index, "request_id": request["request_id"], "step": request["step"]}
        return {"prompt": prompt, "extra_info": extra}, ""
    if index is None or index < 0:
        why = "the capture carries no prompt text (raw_prompts) and no dataset index for these requests"
        if data:
            return None, why + f", so --data {data} cannot be matched to them"
        return None, (
            why + ": verl.logprob-capture stores both where verl's batch has them (raw_prompt, index from "
            "extra_info.index); with the index, --data TRAIN.jsonl (the run's dataset as JSON lines) gives the rows"
        )
    if data:
        return None, f"no raw prompt, and the dataset index is not in --data {data}"
    return None, "no raw prompt in the capture: pass --data TRAIN.jsonl (the run's dataset as JSON lines) for its index"


def _data_rows(path: Path) -> dict[int, dict[str, Any]]:
    """The run's data rows by the index verl carries (`extra_info.index`, else the line number)."""
    rows: dict[int, dict[str, Any]] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise RefusedError(f"--data {path}: not readable as JSON lines ({type(exc).__name__})") from None
    for number, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise RefusedError(f"--data {path}:{number + 1}: not JSON (give the dataset as JSON lines)") from None
        extra = row.get("extra_info") if isinstance(row, dict) else None
        index = extra.get("index") if isinstance(extra, dict) else None
        rows[int(index) if isinstance(index, int) else number] = row
    return rows
