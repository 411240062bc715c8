"""A training launch script read the way bash, Hydra and argparse read it, without running it.

shell.py          the script evaluated statically (tree-sitter-bash): every command it runs
commands.py       which commands launch Python (`Launch`), through which launchers
hydra_compose.py  verl's overrides composed with the tree's own config by Hydra
model.py          the script as what it configures (`Script`, `Setting`), each with its source
script.py         `read_script`: a verl launch, else a slime one; `read_run_facts`
slime_args.py     slime's argparse flags (`python3 train.py --flag value ...`)
"""
