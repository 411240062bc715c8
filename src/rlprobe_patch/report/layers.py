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

from rlprobe_patch.base.errors import RefusedError
from rlprobe_patch.dumps.msprobe import PAIR_FILE

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
            diff = _number(row[col["Max diff"]])
            if diff is not None:
                diff = abs(diff)
                entry["max_diff"] = diff if entry["max_diff"] is None else max(entry["max_diff"], diff)
        relative = _number(row[col["MaxRelativeErr"]].strip().removesuffix("%")) if "MaxRelativeErr" in col else None
        if relative is not None:
            relative = abs(relative) / (100.0 if row[col["MaxRelativeErr"]].strip().endswith("%") else 1.0)
            entry["max_rel_err"] = relative if entry["max_rel_err"] is None else max(entry["max_rel_err"], relative)
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
