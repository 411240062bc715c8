"""Read the result JSONs of run_gpu.sh and print (and write) the numbers RESULTS.md quotes.

    python bench/gpu/summarize.py RESULTS_DIR [--out summary.json]

Loss identity: the per-step losses, grad norms and log-prob digests of every `steps` run of
one engine are compared with the first unpatched run (the timed interleaved rounds that
follow those steps are not part of it). Step-time ratios: each run's median over the steps
after warm-up, patched (DUMP_ON unset) over unpatched, across processes; and the
in-process ABBA interleaved ratio (`interleaved` in the result), which is the tighter one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def load(path: Path):
    try:
        return json.loads(path.read_text())
    except Exception as exc:  # a run that died before writing, or a partial file
        return {"ok": False, "error": f"unreadable {path.name}: {exc}"}


def trajectory(result, engine):
    steps = result.get("steps", [])
    if engine == "fsdp":
        return [(s["losses"], s["grad_norm"], s["log_probs"].get("sha256")) for s in steps]
    return [(s["metrics"].get("loss"), s["metrics"].get("grad_norm"), s["log_probs"].get("sha256")) for s in steps]


def summarize_engine(res_dirs: list[Path], engine: str) -> dict:
    runs = {}
    for d in res_dirs:
        for p in sorted(d.glob(f"{engine}_steps_*.json")):
            label = d.parent.name if d.name == "res" else d.name
            runs[p.stem if len(res_dirs) == 1 else f"{label}/{p.stem}"] = load(p)
    out: dict = {"runs": {}}
    ref_name = next((n for n in runs if "unpatched" in n and runs[n].get("ok")), None)
    ref = trajectory(runs[ref_name], engine) if ref_name else None
    for name, r in runs.items():
        entry = {
            "ok": r.get("ok"),
            "error": r.get("error"),
            "patched_tree": (r.get("fsdp_impl") or r.get("megatron_impl") or {}).get("patched"),
            "median_train_s": r.get("median_train_s"),
            "median_log_prob_s": r.get("median_log_prob_s"),
            "steps": len(r.get("steps", [])),
        }
        if ref is not None and r.get("steps"):
            mine = trajectory(r, engine)
            n = min(len(mine), len(ref))
            entry["same_as_" + ref_name] = mine[:n] == ref[:n]
            entry["steps_compared"] = n
        if "interleaved" in r:
            i = r["interleaved"]
            entry["interleaved"] = {
                k: i[k]
                for k in (
                    "rounds",
                    "ratio_train",
                    "paired_ratio_median_train",
                    "ratio_log_prob",
                    "paired_ratio_median_log_prob",
                    "median_train_s",
                    "median_log_prob_s",
                )
            }
        out["runs"][name] = entry
    ok = {n: r for n, r in runs.items() if r.get("median_train_s")}
    un = [r["median_train_s"] for n, r in ok.items() if "unpatched" in n]
    pa = [r["median_train_s"] for n, r in ok.items() if "unpatched" not in n]
    un_lp = [r["median_log_prob_s"] for n, r in ok.items() if "unpatched" in n]
    pa_lp = [r["median_log_prob_s"] for n, r in ok.items() if "unpatched" not in n]
    if un and pa:
        out["process_ratio_train"] = statistics.median(pa) / statistics.median(un)
        out["process_ratio_log_prob"] = statistics.median(pa_lp) / statistics.median(un_lp)
    dump = next((r for r in runs.values() if "checks" in r or "calls" in r), None)
    if dump is not None:
        out["dump"] = {
            "ok": dump.get("ok"),
            "error": dump.get("error"),
            "checks": dump.get("checks"),
            "checks_ok": dump.get("checks_ok"),
            "calls": [
                {k: c.get(k) for k in ("phase", "kind", "seconds", "expected_steps", "active_finishes")}
                for c in dump.get("calls", [])
            ],
            "dumped_steps": {
                k: {"data_keys": v["data_keys"], "backward_keys": v["backward_keys"], "module_keys": v["module_keys"]}
                for k, v in (dump.get("dump", {}).get("steps") or {}).items()
            },
            "log_lines": [
                {k: line.get(k) for k in ("step", "rank", "request_ids")}
                for line in (dump.get("dump", {}).get("log_lines") or [])
            ],
        }
    any_run = next(iter(ok.values()), None) or dump or {}
    out["versions"] = any_run.get("versions")
    out["device"] = any_run.get("device")
    out["engine"] = any_run.get("engine")
    out["workarounds"] = any_run.get("workarounds")
    out["model"] = (any_run.get("model") or {}).get("config")
    out["tokens_per_batch"] = any_run.get("tokens_per_batch")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("results", type=Path, nargs="+", help="res/ folders of run_gpu.sh (several: pooled)")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    summary = {e: summarize_engine(args.results, e) for e in ("fsdp", "megatron")}
    for extra in ("env.json", "apply_fsdp2.json", "apply_megatron.json", "verify.json"):
        if (args.results[-1] / extra).exists():
            summary[extra[:-5]] = load(args.results[-1] / extra)
    text = json.dumps(summary, indent=1, default=str)
    if args.out:
        args.out.write_text(text + "\n")
    for engine in ("fsdp", "megatron"):
        s = summary[engine]
        print(f"== {engine}: device {s.get('device')}, engine {(s.get('engine') or {}).get('class')}")
        for name, r in s["runs"].items():
            same = {k: v for k, v in r.items() if k.startswith("same_as_")}
            line = (
                f"  {name}: ok={r['ok']} patched={r['patched_tree']} train {fmt_ms(r['median_train_s'])} "
                f"log_prob {fmt_ms(r['median_log_prob_s'])} {same}"
            )
            if r.get("error"):
                line += f" ERROR {r['error'][:200]}"
            print(line)
            if "interleaved" in r:
                i = r["interleaved"]
                print(
                    f"    interleaved x{i['rounds']}: train {i['ratio_train']:.4f}"
                    f" (paired {i['paired_ratio_median_train']:.4f}),"
                    f" log_prob {i['ratio_log_prob']:.4f} (paired {i['paired_ratio_median_log_prob']:.4f})"
                )
        if "process_ratio_train" in s:
            print(
                f"  across processes: train {s['process_ratio_train']:.4f}, log_prob {s['process_ratio_log_prob']:.4f}"
            )
        if s.get("dump"):
            d = s["dump"]
            print(f"  dump ok={d['ok']} checks_ok={d['checks_ok']} {d.get('error') or ''}")
            for c in d["calls"]:
                print(f"    {c}")
            print(f"    checks {d['checks']}")
    return 0


def fmt_ms(x):
    return f"{x * 1e3:.2f} ms" if isinstance(x, (int, float)) else str(x)


if __name__ == "__main__":
    sys.exit(main())
