"""Which of the packages named (argv[1]: JSON, import name -> the distributions that may carry it) this
interpreter has: found by `importlib.util.find_spec` (nothing imported), where, and the version its distribution
metadata gives; and the interpreter itself. One JSON object."""

import importlib.metadata as md
import importlib.util
import json
import sys

wanted = json.loads(sys.argv[1])
out = {"python": sys.executable, "python_version": sys.version.split()[0], "packages": {}}
for name, dists in wanted.items():
    entry = {"found": False, "location": None, "version": None, "distribution": None}
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a parent package missing
        spec = None
    if spec is not None:
        entry["found"] = True
        locs = list(spec.submodule_search_locations or [])
        entry["location"] = locs[0] if locs else spec.origin
    for dist in dists:
        try:
            entry["version"] = md.version(dist)
            entry["distribution"] = dist
            break
        except md.PackageNotFoundError:
            pass
    out["packages"][name] = entry
print(json.dumps(out))
