"""What rlprobe-patch keeps of what it did: the record folder in each tree, and how it changes.

folder.py       `.rlprobe-patch/` in the tree (`RecordFolder`): its layout, lock, ledger, journal, undo, diffs
ledger.py       the ledger and journals as JSON holds them (`Record`, `Ledger`, `Journal`), loaded with each
                field checked (`load_ledger`, `load_journal`): the folder is untrusted input
trust.py        what is refused in a record folder before anything in it is read (links, owners, git files)
history.py      history.git (`History`): the objects of each record, the branches per package
registry.py     the user's registry of patched trees (argument-less verify/status/revert)
transaction.py  journaled writes that a kill at any point survives, `recover`
sorting.py      a tree's records sorted out: live, superseded by an upgrade, outdated
integrity.py    a record's diff and hashes against history.git, before it is trusted
reversal.py     the files' content once records are reversed (revert, upgrades), `merge3`
"""
