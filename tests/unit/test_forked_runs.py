"""tests/runtime/forked_runs.py, the runtime tests' batches of driver runs: each run a process of its own, with its
own environment and standard error, its exit code reported in order; a run that hangs is ended by its alarm."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from conftest import TESTS
from runtime.forked_runs import drive_forked

# a stand-in driver: preload imports a module the runs find in sys.modules; each run says what it sees
DRIVER = f"""
import json, os, sys, time
sys.path.insert(0, {str(TESTS / "runtime")!r})
import forked_runs

forked_runs.RUN_TIMEOUT_S = 2

def preload():
    import decimal

def main(argv):
    what, out = argv
    os.environ["LEAKED"] = "yes"  # a run's change to its environment stays its own
    seen = {{"pid": os.getpid(), "parent": os.getppid(), "switch": os.environ.get("SWITCH"),
            "leaked": os.environ.get("LEAKED_BEFORE"), "preloaded": "decimal" in sys.modules}}
    os.environ["LEAKED_BEFORE"] = "yes"
    with open(out, "w") as f:
        json.dump(seen, f)
    print("said " + what, file=sys.stderr)
    if what == "fail":
        raise RuntimeError("broken on purpose")
    if what == "hang":
        time.sleep(60)
    return 3 if what == "three" else 0

if __name__ == "__main__":
    sys.exit(forked_runs.run_forked(__import__("pathlib").Path(sys.argv[2]), preload, main))
"""


def test_each_run_is_a_process_of_its_own_with_its_environment_and_its_code(tmp_path: Path) -> None:
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    names = ["ok", "three", "fail", "hang", "last"]
    runs = [([name, str(tmp_path / f"{name}.json")], {"SWITCH": name}) for name in names]
    outcomes = drive_forked(Path(sys.executable), driver, runs, tmp_path / "runs")
    assert [code for code, _ in outcomes] == [0, 3, 1, -14, 0]  # -14: SIGALRM, the hang ended
    for name, (_, stderr) in zip(names, outcomes):
        assert stderr.startswith(f"said {name}\n"), (name, stderr)
    assert "RuntimeError: broken on purpose" in outcomes[2][1]
    seen = [json.loads((tmp_path / f"{name}.json").read_text()) for name in names]
    assert [s["switch"] for s in seen] == names  # each run's own environment
    assert all(s["leaked"] is None for s in seen)  # nothing a run set reached the next one
    assert all(s["preloaded"] for s in seen)  # what the driver imported before forking
    assert len({s["pid"] for s in seen}) == len(names) and len({s["parent"] for s in seen}) == 1
    assert os.getpid() not in {s["parent"] for s in seen}  # forked by the driver, not by this process
