"""The bottom of the engine: what every layer above may use, importing nothing of ours but itself.

    errors.py       `ExitCode` and the errors users see, each with its documented exit code
    fsio.py         hashes, writes that land whole or not at all, locks, the fault-injection checkpoints
    gitsafe.py      every git command we run, isolated from the configuration it does not own
    diffs.py        unified diffs of planned changes, with the provenance header git and unidiff skip
    interpreter.py  the training interpreter asked in a subprocess; what it runs is `probes/*.py`

Inside, `errors` is the bottom; `fsio` and `gitsafe` use it; `diffs` uses `gitsafe`, `interpreter` `errors`
(the contract in pyproject.toml).
"""
