"""A stand-in for `datasets`, put on the path by run_gpu.sh only if the carried `datasets` fails to import.

verl imports it at `import verl.utils.dataset` (rl_dataset.py: `import datasets` and
`datasets.Dataset` in a signature); the engines never load a data set. The run records
whether this stand-in was used (env.json: datasets_standin).
"""

STANDIN = True


class Dataset:
    pass


def _refuse(*args, **kwargs):
    raise RuntimeError("datasets stand-in: no data set can be loaded in the GPU bench")


load_dataset = concatenate_datasets = load_from_disk = _refuse
