"""The files the hooks, msprobe and slime write that both `check-dump` (`workflow`) and `report` read.

    slime.py     slime's debug dumps, read by torch in the training interpreter (one probe for both
                 readers); an evaluation rollout's file name
    msprobe.py   the names in msprobe's dump folders and in check-dump's compare folders
    request_ids.py  the request ids vLLM's dispatch logs and the rollout record hold, as verl sent them

Below `workflow` and `report` (which do not import each other), above `base`.
"""
