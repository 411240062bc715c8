"""msprobe's own compare (pt_compare) on each pair of dumps given on stdin (JSON: actor, generate, output, and
the vLLM-to-transformers `data_mapping` with the folder of the actor's flattened `view`), with msprobe's verdict
read from the table it writes. One JSON list, a result per pair."""

import contextlib
import io
import json
import os
import sys

from msprobe.pytorch.compare.pt_compare import pt_compare

pairs = json.loads(sys.stdin.read())  # on stdin: a real model's module mappings pass one argument's limit


def verdict(out, files):
    # msprobe's own verdict per row (its `Result` column: pass / warning / error, from its thresholds),
    # over the rows it matched by name on both sides.
    try:
        import pandas as pd

        path = os.path.join(out, files[-1])
        table = pd.read_csv(path) if path.endswith(".csv") else pd.read_excel(path)
        bench = table["Bench Name"].astype(str)
        matched = table[table["Bench Name"].notna() & ~bench.isin(["N/A", "nan", ""])]
        results = matched["Result"].astype(str).str.lower()
        accuracy = pd.Series([None] * len(matched), index=matched.index, dtype=object)
        tensor_mode = "Cosine" in table.columns  # statistics mode: Max/Min/Mean/L2norm diff, no cosine
        try:  # tensor mode: msprobe's accuracy rule on Cosine and MaxAbsErr (its "Accuracy Reached or Not")
            from msprobe.core.compare.multiprocessing_compute import check_accuracy

            if tensor_mode:
                numeric = pd.to_numeric(matched["Cosine"], errors="coerce").notna()
                accuracy = matched["Cosine"].where(~numeric, None).astype(object)
                for index in matched.index[numeric]:
                    accuracy[index] = check_accuracy(matched.at[index, "Cosine"], matched.at[index, "MaxAbsErr"])
        except ImportError:
            pass
        bad = matched[results.isin(["warning", "error"]) | (accuracy == "No")]
        last = matched[matched["NPU Name"].astype(str).str.contains(r"\.output\.", regex=True)].tail(1)
        return {
            "rows": len(table),
            "matched": len(matched),
            "results": {k: int(v) for k, v in results.value_counts().items()},
            "accuracy_reached": {k: int(v) for k, v in accuracy[accuracy.isin(["Yes", "No"])].value_counts().items()},
            "agree": bool(len(matched)) and bad.empty,
            "mismatched": [str(n) for n in bad["NPU Name"].head(10)],
            "mode": "tensor" if tensor_mode else "statistics",
            "last_output": {
                "name": str(last["NPU Name"].iloc[0]),
                "result": str(last["Result"].iloc[0]),
                **(
                    {"cosine": str(last["Cosine"].iloc[0]), "max_abs_err": str(last["MaxAbsErr"].iloc[0])}
                    if tensor_mode
                    else {"max_diff": str(last["Max diff"].iloc[0])}
                ),
            }
            if len(last)
            else None,
        }
    except Exception as exc:  # an older msprobe's columns: the files are still there
        return {"agree": None, "verdict_error": f"{type(exc).__name__}: {exc}"}


def flat_view(dump, folder, mapping):
    # The actor dump as vLLM lays out a step: the tensors of the mapped modules (inputs, outputs) of a
    # one-sequence micro-batch without their leading [1, ...] (values, dtypes, statistics untouched);
    # the tensors are copies, the actor's dump stays as it is.
    import torch

    with open(dump) as f:
        doc = json.load(f)
    modules = {row.split(".parameters.")[0].rsplit(".output.", 1)[0] for row in mapping}
    src = os.path.join(os.path.dirname(dump), "dump_tensor_data")
    dst = os.path.join(folder, "dump_tensor_data")
    os.makedirs(dst, exist_ok=True)

    def walk(node, flatten):
        if isinstance(node, dict) and node.get("data_name"):  # tensor mode: the tensor's file and its shape
            name = node["data_name"]
            if not os.path.isfile(os.path.join(src, name)):
                return
            value = torch.load(os.path.join(src, name), weights_only=True)
            shape = node.get("shape") or []
            if flatten and len(shape) > 1 and shape[0] == 1:
                value = value.squeeze(0)
                node["shape"] = list(shape[1:])
            torch.save(value, os.path.join(dst, name))
        elif isinstance(node, dict) and isinstance(node.get("shape"), list) and "Max" in node:  # statistics mode
            shape = node["shape"]
            if flatten and len(shape) > 1 and shape[0] == 1:
                node["shape"] = list(shape[1:])
        elif isinstance(node, dict):
            for value in node.values():
                walk(value, flatten)
        elif isinstance(node, list):
            for value in node:
                walk(value, flatten)

    for key, entry in doc["data"].items():
        for part, value in entry.items():
            walk(value, key in modules and part != "parameters")
    path = os.path.join(folder, "dump.json")
    with open(path, "w") as f:
        json.dump(doc, f)
    return path


results = []
for pair in pairs:
    out = pair["output"]
    os.makedirs(out, exist_ok=True)
    buf = io.StringIO()
    try:
        actor = pair["actor"]
        mapping = pair.get("data_mapping") or {}
        if mapping:
            actor = flat_view(actor, pair["view"], mapping)
        with contextlib.redirect_stdout(buf):
            pt_compare(
                {"npu_path": actor, "bench_path": pair["generate"], "is_print_compare_log": False},
                out,
                **({"data_mapping": mapping} if mapping else {}),
            )
        files = sorted(f for f in os.listdir(out) if f.endswith((".csv", ".xlsx")))
        results.append(
            {"ok": bool(files), "output": out, "files": files, "mapped_rows": len(mapping), **verdict(out, files)}
        )
    except BaseException as exc:
        results.append(
            {
                "ok": False,
                "output": out,
                "error": f"{type(exc).__name__}: {exc}",
                "log": buf.getvalue().splitlines()[-5:],
            }
        )
print(json.dumps(results))
