"""What exists upstream and in `patches/`: the patches, the release data, and the trees found.

    releases.py  `patches/releases/<package>.toml`: tested and refused releases, cut-offs,
                 worker paths, fingerprints, defaults (no release number lives in code)
    patches.py   the catalogue: one folder per patch, discovered (`load_catalogue`, `select`)
    trees.py     finding a package tree and its version without running any of its code
    wheels.py    a release's wheel (or archive) fetched into the shared download cache, and unpacked

`releases` and `trees` do not import LibCST (the launch reader and the CLI's option lists use
them); `patches` does, through `rlprobe_patch.codemod`.
"""
