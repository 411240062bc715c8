"""Names in msprobe's dump folders and in `check-dump --compare`'s output, which `report` reads."""

# msprobe keeps each dump's tensors in this folder (also check-dump's actor views): torch files, never slime's
TENSORS = "dump_tensor_data"
# in each pair's compare folder: the pair check-dump made (request, both dumps' step and rank), for report's headings
PAIR_FILE = "pair.json"
