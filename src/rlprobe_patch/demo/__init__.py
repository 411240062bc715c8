"""`rlprobe-patch demo`: `patch_cycle.py` (a real verl release: apply, verify, revert, identity)
and `consistency.py` (the consistency chain end to end on the CPU; `drivers/` run in its venv)."""
