"""Summary of the script oracle's truth on the shared verl example corpora (issue 12 figures).

python bench/oracle_truth.py            # both corpora; --json for the raw truth per script
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from script_oracle import CORPORA, corpus_truth


def summary(corpus: str) -> dict:
    start = time.perf_counter()
    truths = corpus_truth(corpus)
    composed = [t for t in truths if t.composes]
    per_fact = {
        key: Counter(str(t.main.facts.get(key, "<absent>")) for t in composed)  # type: ignore[union-attr]
        for key in ("train_backend", "rollout_backend", "use_legacy_worker_impl", "use_v1", "actor_tp", "rollout_tp")
    }
    return {
        "corpus": corpus,
        "scripts": len(truths),
        "status": dict(Counter(t.status for t in truths)),
        "several_launches": sum(len(t.launches) > 1 for t in truths),
        "entry_points": dict(Counter(lt.entry for t in truths for lt in t.launches)),
        "config_names": dict(Counter(t.main.config_name for t in truths if t.main)),
        "facts": {key: dict(counts) for key, counts in per_fact.items()},
        "not_composing": {
            t.script: (t.main.error if t.main and t.main.error else t.status)
            + ("" if t.exit_code == 0 else f" [bash exit {t.exit_code}: {t.stderr_tail[-200:]}]")
            for t in truths
            if not t.composes
        },
        "seconds": round(time.perf_counter() - start, 1),
    }


def main() -> None:
    if "--json" in sys.argv:
        print(
            json.dumps(
                {
                    c: [t.__dict__ | {"launches": [lt.__dict__ for lt in t.launches]} for t in corpus_truth(c)]
                    for c in CORPORA
                },
                indent=1,
                default=str,
            )
        )
        return
    for corpus in CORPORA:
        print(json.dumps(summary(corpus), indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
