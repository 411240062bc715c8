"""What rlprobe-patch keeps of what it did: the record folder in each tree, and how it changes.

folder.py       `.rlprobe-patch/` in the tree: ledger, journal, undo, diffs, history.git
                (`RecordFolder`, `Record`, `Ledger`, `Journal`); treated as untrusted input
registry.py     the user's registry of patched trees (argument-less verify/status/revert)
transaction.py  journaled writes that a kill at any point survives, `recover`
sorting.py      a tree's records sorted out: live, superseded by an upgrade, outdated
integrity.py    a record's diff and hashes against history.git, before it is trusted
reversal.py     the files' content once records are reversed (revert, upgrades), `merge3`
"""
