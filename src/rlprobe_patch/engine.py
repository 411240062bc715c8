"""The transaction core's public names, in one place (the modules that define them are below).

sites.py        one site's state (`site_state`), the files a plan reads (`Workspace`)
plan.py         `Selection`, `plan_apply`: every change decided in memory, upgrades included
transaction.py  journaled writes, `recover`
apply.py        a plan written as one transaction, one record
verify.py       our checks, the records against the tree, the package's rules
revert.py       byte-for-byte revert, `--merge`
status.py       states of every patch, live and superseded records
records.py      live / superseded / outdated records
rules.py        package rules from the release data (worker paths, the skill's checkers)
"""

from __future__ import annotations

from rlprobe_patch.apply import ApplyResult, apply
from rlprobe_patch.plan import NOT_FOR_THIS_RELEASE, Change, PatchPlan, Plan, Selection, plan_apply, raise_if_refused
from rlprobe_patch.revert import RevertResult, revert
from rlprobe_patch.rules import hooked_worker_paths, read_run_facts, resolve_worker_impl
from rlprobe_patch.sites import digest, file_mode, read_or_none, read_target
from rlprobe_patch.status import StatusResult, status
from rlprobe_patch.transaction import recover, write_phase
from rlprobe_patch.verify import Check, VerifyResult, verify

__all__ = [
    "NOT_FOR_THIS_RELEASE",
    "ApplyResult",
    "Change",
    "Check",
    "PatchPlan",
    "Plan",
    "RevertResult",
    "Selection",
    "StatusResult",
    "VerifyResult",
    "apply",
    "digest",
    "file_mode",
    "hooked_worker_paths",
    "plan_apply",
    "raise_if_refused",
    "read_or_none",
    "read_run_facts",
    "read_target",
    "recover",
    "resolve_worker_impl",
    "revert",
    "status",
    "verify",
    "write_phase",
]
