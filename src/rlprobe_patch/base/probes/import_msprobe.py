"""Whether `from msprobe.pytorch import PrecisionDebugger` works in this interpreter (it imports msprobe and
its torch: the point), with msprobe's version, else the error and its traceback's tail. One JSON object."""

import json
import traceback

try:
    import importlib.metadata as md

    from msprobe.pytorch import PrecisionDebugger  # noqa: F401

    print(json.dumps({"ok": True, "version": md.version("mindstudio-probe")}))
except BaseException as exc:
    error = f"{type(exc).__name__}: {exc}"
    print(json.dumps({"ok": False, "error": error, "traceback": traceback.format_exc()[-2000:]}))
