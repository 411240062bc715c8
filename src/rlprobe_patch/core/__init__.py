"""The transaction core: which patches a tree gets, and applying, verifying and reverting them.

    checks.py       `Check`: one check's outcome, as verify prints it
    selection.py    `Selection`: what the user asked for; `select_trees`: each tree's selection
    roots.py        `Roots`: the trees a command acts on (named, imported, or registered)
    sites.py        one site's state (`site_state`), the files a plan reads (`Workspace`)
    plan.py         `plan_apply`: every change decided in memory, upgrades included
    apply.py        a plan written as one transaction (`record.transaction`), one record
    verify.py       our checks, the records against the tree, the package's rules
    revert.py       byte-for-byte revert (`record.reversal`), `--merge`, `back_to`
    status.py       states of every patch, live and superseded records
    rules.py        package rules from the release data (worker paths, the skill's checkers)
    skill_checks.py the skill's own checker scripts, reproduced

Below it: `record` (the record folder in each tree, its transaction, reversal and integrity),
`catalogue` (patches, releases, trees), `codemod` (the toolkit the patches are written with).
Above it: `workflow`, `cluster`, `demo`, `matrix` and the `cli`. The core names no package:
what differs per package is in `rules.py`, `patches/` and `patches/releases/`.
"""
