"""The collection workflow around the patches: detect, doctor, config, script, check-dump.

The skill (`rl-msprobe`) does these steps with grep scripts and templates; here they read the
training script as shell words and Hydra overrides, load the YAML files it names, and ask the
training interpreter (a subprocess) what is installed.
"""
