"""An msprobe config (argv[1]) loaded by msprobe's own parser in this interpreter, as the hook loads it (argv[2]:
the training dump path's stand-in, "" for a rollout config): its task, level, steps, ranks and dump path, or where
it failed; msprobe's version and the error lines it logged. One JSON object."""

import contextlib
import importlib.metadata as md
import io
import json
import sys

path, stand_in = sys.argv[1], sys.argv[2]
buf = io.StringIO()
result = {"ok": False}
try:
    with contextlib.redirect_stdout(buf):
        result["stage"] = "import"
        from msprobe.pytorch.dump.pt_config import parse_json_config  # noqa: I001  (msprobe's order, as the hook's)
        from msprobe.pytorch.dump.debugger.debugger_config import DebuggerConfig

        result["stage"] = "parse"
        common, task_config = parse_json_config(path, None)
        debugger = DebuggerConfig(common, task_config, None, stand_in or None, None)
    result = {
        "ok": True,
        "task": debugger.task,
        "level": debugger.level,
        "step": debugger.step,
        "rank": debugger.rank,
        "dump_path": common.dump_path,
    }
except BaseException as exc:
    result = {"ok": False, "stage": result.get("stage"), "error": f"{type(exc).__name__}: {exc}"}
try:
    result["msprobe"] = md.version("mindstudio-probe")
except md.PackageNotFoundError:
    result["msprobe"] = None
result["log"] = [line for line in buf.getvalue().splitlines() if "ERROR" in line or "error" in line][-10:]
print(json.dumps(result))
