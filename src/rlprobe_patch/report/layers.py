"""msprobe's compare CSVs (`check-dump --compare`): per pair, the modules in forward order.

`check-dump --compare` runs msprobe's `compare` on each (actor, generate) pair into
`<compare-output>/<NNN>_<request id>/compare_result_<time>.csv`. mindstudio-probe 26.2.0 writes
one row per tensor (a module's or API's input, parameters, output), in the order the dump
recorded them (the forward order), with the columns of its `CompareConst`:

- tensor mode (`task: tensor`): `NPU Name`, `Bench Name`, the dtypes, shapes and requires_grad
  of both sides, `Cosine`, `EucDist`, `MaxAbsErr`, `MaxRelativeErr`, the error ratios, the
  statistics of both sides, `Requires_grad Consistent`, `Result`, `Err_message` (+ `NPU_Stack_Info`,
  `Data_name`);
- statistics mode (`task: statistics`): `Max diff`, `Min diff`, `Mean diff`, `L2norm diff` and
  their relative errors instead of the tensor columns (no cosine).

A module leaves msprobe's thresholds when its `Result` is `warning` or `error`, or (tensor mode)
when msprobe's accuracy rule on `Cosine` and `MaxAbsErr` says no: cosine < 0.99 with
MaxAbsErr > 0.001, or cosine < 0.9, or MaxAbsErr > 1 (mindstudio-probe 26.2.0's thresholds, the
rule `check-dump --compare` applies too). A module's figures are its output rows' (the worst
cosine, the largest error).
"""

from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlprobe_patch.base.errors import RefusedError
from rlprobe_patch.dumps.msprobe import PAIR_FILE
from rlprobe_patch.report.floor import FLOOR_FACTOR

_BASIC = [
    "NPU Name",
    "Bench Name",
    "NPU Dtype",
    "Bench Dtype",
    "NPU Tensor Shape",
    "Bench Tensor Shape",
    "NPU Requires_grad",
    "Bench Requires_grad",
]
_TENSOR = ["Cosine", "EucDist", "MaxAbsErr", "MaxRelativeErr"]
_SUMMARY = ["Max diff", "Min diff", "Mean diff", "L2norm diff"]
_TAIL = ["Requires_grad Consistent", "Result", "Err_message"]
MSPROBE_VERSION = "26.2.0"

COS_THRESHOLD = 0.99
MAX_ABS_ERR_THRESHOLD = 0.001
COS_MAX_THRESHOLD = 0.9
MAX_ABS_ERR_MAX_THRESHOLD = 1.0

# `Module.model.layers.0.mlp.Qwen2MLP.forward.0.output.0` -> module `Module.model.layers.0.mlp.Qwen2MLP.forward.0`,
# role `output`; an API's `Tensor.add.3.forward.output.0` -> `Tensor.add.3.forward`
_ROW = re.compile(
    r"^(?P<module>.+?(?:\.(?:forward|backward)\.\d+|\.\d+\.(?:forward|backward)))"
    r"\.(?P<role>input|output|kwargs|parameters?|parameters_grad)(?:\.|$)"
)


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def accuracy_fails(cosine: float | None, max_abs_err: float | None) -> bool:
    """msprobe's accuracy rule on a row's Cosine and MaxAbsErr (no numbers: not failed)."""
    if cosine is None or max_abs_err is None:
        return False
    if cosine < COS_THRESHOLD and max_abs_err > MAX_ABS_ERR_THRESHOLD:
        return True
    return cosine < COS_MAX_THRESHOLD or max_abs_err > MAX_ABS_ERR_MAX_THRESHOLD


@dataclass
class PairCompare:
    name: str  # the pair's folder name (`000_req-0`)
    path: str
    mode: str  # "tensor" | "statistics"
    modules: list[dict[str, Any]] = field(default_factory=list)
    run: str = ""  # the compare output folder the pair is in (`--compare-output`: one per rollout compared)
    info: dict[str, Any] = field(default_factory=dict)  # check-dump's pair.json: the request, both dumps
    info_problem: str = ""  # why pair.json, there, could not be read (the report says so)

    @property
    def label(self) -> str:
        """The pair named uniquely over several compare folders: `<run>/<pair folder>`."""
        return f"{self.run}/{self.name}" if self.run else self.name

    @property
    def request_id(self) -> str:
        return str(self.info.get("request_id") or self.name.split("_", 1)[-1])

    def heading(self) -> str:
        """Which run, request, steps and micro-batch the pair compares, as far as check-dump recorded it."""
        parts = [f"run {self.run}" if self.run else "", f"request {self.request_id}"]
        actor, generate = self.info.get("actor") or {}, self.info.get("generate") or {}
        if actor:
            keys = [k for k in ("micro_batch", "phase", "pp_rank") if k in self.info]
            labels = [f"{k.replace('_', '-')} {self.info[k]}" for k in keys]
            stage = f" ({', '.join(labels)})" if labels else ""
            parts.append(f"training dump step {actor.get('step')} rank {actor.get('rank')}{stage}")
        if generate:
            parts.append(f"rollout dump step {generate.get('step')} rank {generate.get('rank')}")
        return " · ".join(p for p in parts if p)

    @property
    def first_divergence(self) -> dict[str, Any] | None:
        return next((m for m in self.modules if m["diverges"]), None)

    def to_json(self) -> dict[str, Any]:
        first = self.first_divergence
        return {
            "pair": self.name,
            "run": self.run,
            "label": self.label,
            "request_id": self.request_id,
            "heading": self.heading(),
            "path": self.path,
            "mode": self.mode,
            "modules": self.modules,
            "first_divergence": first["module"] if first else None,
        }


def compare_files(paths: list[Path]) -> list[Path]:
    """The compare CSVs under the paths given (files named as such, or found in folders)."""
    return [p for p in paths if p.is_file()] + [
        f for p in paths if p.is_dir() for f in sorted(p.rglob("compare_result*.csv"))
    ]


def read_compare_csv(path: Path) -> PairCompare:
    """One pair's compare CSV, checked against mindstudio-probe 26.2.0's columns."""
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            body = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise RefusedError(f"{path}: not a readable msprobe compare CSV ({type(exc).__name__}: {exc})") from None
    if header is None:
        raise RefusedError(f"{path}: empty: not an msprobe compare CSV")
    if "NPU Name" not in header or "Bench Name" not in header:
        raise RefusedError(f"{path}: not an msprobe compare CSV (no 'NPU Name' / 'Bench Name' columns)")
    if header[: len(_BASIC)] == _BASIC and all(c in header for c in _TENSOR + _TAIL):
        mode = "tensor"
    elif header[: len(_BASIC)] == _BASIC and all(c in header for c in _SUMMARY + _TAIL):
        mode = "statistics"
    else:
        missing = [c for c in _BASIC + _TAIL if c not in header]
        raise RefusedError(
            f"{path}: an msprobe compare CSV of another version (columns {', '.join(header[:12])}"
            + (f"; missing {', '.join(missing)}" if missing else "")
            + f"); rlprobe-patch reads mindstudio-probe {MSPROBE_VERSION}'s",
            hint="run check-dump --compare with mindstudio-probe 26.2.0 in --python",
        )
    col = {name: i for i, name in enumerate(header)}
    modules: dict[str, dict[str, Any]] = {}
    for line_no, row in enumerate(body, start=2):
        if len(row) != len(header):
            raise RefusedError(f"{path}:{line_no}: {len(row)} fields, the header has {len(header)} (truncated?)")
        name = row[col["NPU Name"]]
        bench = row[col["Bench Name"]]
        if bench in ("", "N/A", "nan"):
            continue  # no counterpart on the bench side
        match = _ROW.match(name)
        module, role = (match["module"], match["role"]) if match else (name, "output")
        entry = modules.setdefault(
            module,
            {
                "module": module,
                "cosine": None,
                "max_abs_err": None,
                "max_diff": None,
                "max_rel_err": None,  # msprobe's MaxRelativeErr of the outputs, as a fraction
                "min_diff": None,  # statistics mode: |Min diff|, the other end of the outputs (None in tensor mode)
                "min_rel_err": None,
                "result": "pass",
                "accuracy_fails": False,
                "diverges": False,
                "rows": 0,
            },
        )
        entry["rows"] += 1
        result = row[col["Result"]].strip().lower()
        if role != "output":
            continue
        if mode == "tensor":
            cosine, err = _number(row[col["Cosine"]]), _number(row[col["MaxAbsErr"]])
            if cosine is not None:
                entry["cosine"] = cosine if entry["cosine"] is None else min(entry["cosine"], cosine)
            if err is not None:
                entry["max_abs_err"] = err if entry["max_abs_err"] is None else max(entry["max_abs_err"], err)
            entry["accuracy_fails"] = entry["accuracy_fails"] or accuracy_fails(cosine, err)
        else:
            for key, column in (("max_diff", "Max diff"), ("min_diff", "Min diff")):
                _keep_largest(entry, key, _number(row[col[column]]))
        for key, column in (("max_rel_err", "MaxRelativeErr"), ("min_rel_err", "MinRelativeErr")):
            if column in col and (mode == "statistics" or key == "max_rel_err"):
                _keep_largest(entry, key, _relative(row[col[column]]))
        if _rank(result) > _rank(entry["result"]):
            entry["result"] = result
        entry["diverges"] = entry["accuracy_fails"] or entry["result"] in ("warning", "error")
    info_path = path.parent / PAIR_FILE
    problem = ""
    try:
        info = json.loads(info_path.read_text(encoding="utf-8")) if info_path.is_file() else {}
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        info = {}  # the heading loses the request's steps, nothing else depends on it: said, not silent
        problem = f"{info_path}: not readable as check-dump's JSON ({type(exc).__name__}: {exc})"
    if not isinstance(info, dict):
        info, problem = {}, f"{info_path}: not a JSON object"
    return PairCompare(
        name=path.parent.name,
        path=str(path),
        mode=mode,
        modules=list(modules.values()),
        run=path.parent.parent.name,
        info=info,
        info_problem=problem,
    )


def _keep_largest(entry: dict[str, Any], key: str, value: float | None) -> None:
    """A module's figure over its output rows: the largest magnitude."""
    if value is not None:
        entry[key] = abs(value) if entry[key] is None else max(entry[key], abs(value))


def _relative(text: str) -> float | None:
    """msprobe's relative errors as a fraction (it writes `0.47%` in statistics mode, a plain number in tensor mode)."""
    value = _number(text.strip().removesuffix("%"))
    return None if value is None else value / (100.0 if text.strip().endswith("%") else 1.0)


def _rank(result: str) -> int:
    return {"pass": 0, "warning": 1, "error": 2}.get(result, 0)


def layer_summary(pairs: list[PairCompare]) -> dict[str, Any]:
    """Per pair its first divergence; the first module that diverges in every disagreeing pair."""
    disagreeing = [p for p in pairs if p.first_divergence is not None]
    common = None
    if disagreeing:
        diverging_sets = [{m["module"] for m in p.modules if m["diverges"]} for p in disagreeing]
        shared = set.intersection(*diverging_sets)
        # in the forward order of the first disagreeing pair
        common = next((m["module"] for m in disagreeing[0].modules if m["module"] in shared), None)
    return {
        "pairs": [p.to_json() for p in pairs],
        "disagreeing_pairs": [p.label for p in disagreeing],
        "first_common_divergence": common,
    }


# --- the compare against its own floor -------------------------------------------------------------------------

# a module whose outputs differ by less than this, relative, is within any layer floor: float32 rounding through a
# model's layers stays near 1e-6 (the demo's same-weights pairs: 4e-7 to 9e-7), a real difference is far above
LAYER_RESOLUTION = 1e-4


def _errors(module: dict[str, Any]) -> dict[str, tuple[float, float | None]]:
    """A module's errors, each with its relative error where msprobe gives one: in tensor mode MaxAbsErr; in statistics
    mode |Max diff| and |Min diff|, both ends of its outputs (a broken layer can leave one end where it was)."""
    pairs = [("max_abs_err", "max_rel_err")] if module["max_abs_err"] is not None else []
    pairs += [("max_diff", "max_rel_err"), ("min_diff", "min_rel_err")] if module["max_abs_err"] is None else []
    return {k: (float(module[k]), module.get(r)) for k, r in pairs if module.get(k) is not None}


def reference_pairs(layers: dict[str, Any] | None, clean: set[str] | None = None) -> list[dict[str, Any]]:
    """The pairs that make the layer floor: those msprobe finds within its thresholds (the same computation on both
    sides, as float32 leaves it), and those of the `clean` requests (a step the diagnosis found within its measured
    token floor, with the same ids, weights and dtypes on both sides: the clean run's compare, which in bfloat16 leaves
    msprobe's absolute thresholds in every pair)."""
    pairs = (layers or {}).get("pairs", [])
    return [p for p in pairs if p["first_divergence"] is None or p["request_id"] in (clean or set())]


def layer_floor(reference: list[dict[str, Any]]) -> dict[str, dict[str, float]] | None:
    """Per error (`_errors`) and module, the largest in the reference pairs: the layer compare's own noise floor;
    None without a reference pair."""
    if not reference:
        return None
    floor: dict[str, dict[str, float]] = {}
    for pair in reference:
        for m in pair["modules"]:
            for name, (error, _) in _errors(m).items():
                by_module = floor.setdefault(name, {})
                by_module[m["module"]] = max(by_module.get(m["module"], 0.0), error)
    return floor


@dataclass(frozen=True)
class LayerView:
    """The layer compare read against its own floor: the pairs that leave it, those msprobe flags within it (its
    statistics rules flag float rounding: "the norm relative error of output is 10 times that of input"; in bfloat16
    its absolute thresholds flag every pair), and the first module out of it common to every pair that leaves it."""

    pairs: int
    disagreeing: list[str]  # pair labels
    within_floor: list[str]  # flagged by msprobe, every module within the layer floor
    first_common: str | None
    depth: int | None  # where first_common sits in the forward order (0: the first module)
    modules: int
    how: str
    reference: list[str] = field(default_factory=list)  # the pairs the layer floor is made of (labels)

    @property
    def agree(self) -> bool:
        return self.pairs > 0 and not self.disagreeing


def layer_view(
    layers: dict[str, Any] | None, request_ids: set[str] | None = None, clean: set[str] | None = None
) -> LayerView | None:
    """The layer compare against its floor (`reference_pairs`: msprobe's agreeing pairs and the `clean` requests'),
    read on the pairs of `request_ids` where some pair is of one of them (a step's own requests: check-dump's
    pair.json names each pair's), else on every pair."""
    if not layers or not layers["pairs"]:
        return None
    reference = reference_pairs(layers, clean)
    floor = layer_floor(reference)
    pairs = layers["pairs"]
    if request_ids and any(p["request_id"] in request_ids for p in pairs):
        pairs = [p for p in pairs if p["request_id"] in request_ids]
    flagged = [p for p in pairs if p["label"] in set(layers["disagreeing_pairs"])]
    if floor is None:
        how = "out of msprobe's thresholds"
        outs = [{m["module"] for m in p["modules"] if m["diverges"]} for p in flagged]
    else:
        typical = {name: float(np.median(list(by_module.values()))) for name, by_module in floor.items()}
        outs = [{m["module"] for m in p["modules"] if _out_of_layer_floor(m, floor, typical)} for p in flagged]
        agreeing = sum(p["first_divergence"] is None for p in reference)
        clean_pairs = len(reference) - agreeing
        parts = [f"{agreeing} pair(s) within msprobe's thresholds", f"the clean step(s)' {clean_pairs} pair(s)"]
        made_of = " and ".join(part for part, count in zip(parts, (agreeing, clean_pairs)) if count)
        medians = ", ".join(f"{name} {value:.3g}" for name, value in typical.items())
        how = (
            f"out of the layer floor ({FLOOR_FACTOR:g}x each module's largest error in {made_of}, and at least "
            f"{FLOOR_FACTOR:g}x the median module's: {medians})"
        )
    disagreeing = [p for p, o in zip(flagged, outs) if o]
    noise = [p for p, o in zip(flagged, outs) if not o]
    out = [o for o in outs if o]
    shared = set.intersection(*out) if out else set()
    common = next((m["module"] for m in disagreeing[0]["modules"] if m["module"] in shared), None) if out else None
    depth = modules = None
    if common is not None and disagreeing:
        names = [m["module"] for m in disagreeing[0]["modules"]]
        depth, modules = names.index(common), len(names)
    return LayerView(
        pairs=len(pairs),
        disagreeing=[p["label"] for p in disagreeing],
        within_floor=[p["label"] for p in noise],
        first_common=common,
        depth=depth,
        modules=modules or 0,
        how=how,
        reference=[p["label"] for p in reference],
    )


def _out_of_layer_floor(module: dict[str, Any], floor: dict[str, dict[str, float]], typical: dict[str, float]) -> bool:
    # one of its errors above FLOOR_FACTOR times the module's own floor and the typical module's (a floor of 0: no
    # rounding there), and above the rounding any float32 computation leaves, relative to the module's outputs
    for name, (error, relative) in _errors(module).items():
        if relative is not None and relative < LAYER_RESOLUTION:
            continue
        limit = FLOOR_FACTOR * max(floor.get(name, {}).get(module["module"], 0.0), typical.get(name, 0.0))
        if error > limit:
            return True
    return False
