"""The collection workflow around the patches: detect, doctor, config, script, check-dump.

    detect.py          the collection mode and backends of a training script, with their sources
    derive/            `script` / `check-script`: one adapter per training framework (verl, slime)
    collection.py      `script`'s work: the collection script, its capture run and configs, derived and written
    config.py          msprobe config.json per mode and side, checked by msprobe itself
    pairing.py         what an SGLang or vLLM rollout needs for its prefills to pair by request id
    check_dump.py      the dump layout and the generate/actor pairs; msprobe's compare per pair
    slime_dumps.py     slime's own debug dumps, tied to the actor steps
    doctor.py          can the training interpreter run msprobe
    engines.py         which engine serves verl's vLLM rollout there, and whether it dumps

The skill (`rl-msprobe`) does these steps with grep scripts and templates; here they read the
training script as shell words and Hydra overrides (`launch/`), load the YAML files it names,
and ask the training interpreter what is installed (`base.interpreter`). It does not import `report`.
"""
