"""`rlprobe-patch report`: per-token train-vs-rollout log-probs joined with the layer compare.

Beside `workflow` (neither imports the other: what both read, slime's dumps and msprobe's folders, is
`dumps`), below `matrix`, `demo` and `cli`:

- `make.py`: the command as one call, `make_report(ReportRequest) -> Report` (what the CLI prints, its exit);
- `capture_format.py`: the per-step capture file (`write_capture`, `read_capture`, `TokenBatch`);
- `slime_logprobs.py`: slime's debug dumps joined by rollout position, else sample index;
- `layers.py`: msprobe's compare CSVs, module by module in forward order;
- `metrics.py`: verl's debug and off-policy metrics re-implemented in numpy, per-request figures,
  the difference by position and by probability;
- `build.py`: the inputs sorted and read, the report's document, the thresholds, the replay files;
- `identity.py`, `rollout_record.py`, `weights.py`: the identity check before any number: the capture's ids
  against the rollout engine's own record of each request, and both sides' weight fingerprints;
- `diagnosis.py`, `verdict.py`: the causes ranked against the noise floor; the verdict by verl's guidance and
  the diagnosis' step by step; `confirm.py`: the runs that would confirm one (the launch script with one
  setting changed, printed only where that differs from its consistency script);
- `next_steps.py`: the commands printed next (`next:`), each as it runs, placeholders defined on the line;
- `summary.py`: the text the command prints, and the readings the page shares with it;
- `page.py` with `templates/report.html`: report.html by a Jinja2 template with autoescape (every value escaped);
- `plots.py`: the plots' inline SVG (`svgplot.py` the token plots' small charts, matplotlib the layer plot);
- `write_outputs` (here): report.json and report.html, each whole or not at all.

numpy, matplotlib and Jinja2 are dependencies (the `report` extra is kept for old install lines); they are imported
when the command runs, matplotlib only for a layer compare.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rlprobe_patch.base.fsio import atomic_write


def _plain(value: Any) -> Any:
    """`value` as JSON holds it: NaN as null, an infinity as the string "inf" / "-inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else str(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# one encoder for every value (json.dumps with an argument builds one per call: a request's line is thousands of
# calls on a large run)
_ENCODER = json.JSONEncoder(allow_nan=False)


def json_text(value: Any) -> str:
    """`json.dumps` of `value` as `_plain` makes it; the walk only where a float is not finite (the C
    encoder refuses those), so a report without NaN is encoded at the C encoder's speed."""
    try:
        return _ENCODER.encode(value)
    except ValueError:
        return _ENCODER.encode(_plain(value))


class EncodedList(list[Any]):
    """A list of JSON objects with their one-line texts (`json_text`), made where the items were (the report's
    requests, most of report.json's text: each step's encoded with its figures, in its thread). `encode` lays out the
    texts given. Nothing changes the list after: the texts are of the items as they were."""

    def __init__(self, items: list[Any], texts: list[str]) -> None:
        super().__init__(items)
        if len(texts) != len(items):
            raise ValueError(f"{len(texts)} texts for {len(items)} items")
        self._texts = texts

    def texts(self) -> list[str]:
        return self._texts


def to_json(report: dict[str, Any]) -> dict[str, Any]:
    """The report as JSON holds it (NaN as null, infinities as strings)."""
    plain: dict[str, Any] = _plain(report)
    return plain


def dumps(document: dict[str, Any]) -> str:
    """JSON laid out for reading, at the C encoder's speed: a key a line down to the second level, and
    each entry of a list of objects (requests, steps, modules) on one line."""
    return _layout(document, 0)[0] + "\n"


def encode(document: dict[str, Any]) -> tuple[str, str]:
    """report.json's text (`dumps`), and the document on one line as `json.dumps(to_json(document))`
    writes it (what `--json` prints): each value is formatted once for both, the requests' numbers being
    most of the work; NaN and infinities as `to_json` writes them."""
    text, line = _layout(document, 0)
    return text + "\n", line


def with_entry(line: str, key: str, value: Any) -> str:
    """`line`, a JSON object on one line, with `key: value` added last, as `json.dumps` would write it."""
    entry = f"{json.dumps(key)}: {json.dumps(value)}"
    return "{" + entry + "}" if line == "{}" else line[:-1] + ", " + entry + "}"


def _layout(value: Any, depth: int) -> tuple[str, str]:
    """`value` laid out at `depth`, and on one line; the keys are strings (as json.dumps writes them
    either way)."""
    pad = " " * (depth + 1)
    if depth < 3 and isinstance(value, dict) and value:
        items = [(json_text(k), *_layout(v, depth + 1)) for k, v in value.items()]
        return (
            "{\n" + ",\n".join(f"{pad}{k}: {laid}" for k, laid, _ in items) + "\n" + " " * depth + "}",
            "{" + ", ".join(f"{k}: {line}" for k, _, line in items) + "}",
        )
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        if depth < 2:
            entries = [_layout(v, depth + 1) for v in value]
        else:
            texts = value.texts() if isinstance(value, EncodedList) else map(json_text, value)
            entries = [(text, text) for text in texts]
        return (
            "[\n" + ",\n".join(pad + laid for laid, _ in entries) + "\n" + " " * depth + "]",
            "[" + ", ".join(line for _, line in entries) + "]",
        )
    text = json_text(value)
    return text, text


def write_outputs(text: str, html_text: str, directory: Path) -> dict[str, str]:
    """report.json (`text`: the report as `encode` lays it out) then report.html, each through a
    temporary file and a rename."""
    directory.mkdir(parents=True, exist_ok=True)
    json_path, html_path = directory / "report.json", directory / "report.html"
    atomic_write(json_path, text.encode())
    atomic_write(html_path, html_text.encode())
    return {"json": str(json_path), "html": str(html_path)}
