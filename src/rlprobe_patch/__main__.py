from rlprobe_patch.cli import main

main()
