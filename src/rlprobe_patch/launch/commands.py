"""Which of a script's commands launch Python, and with which arguments.

The launchers verl's examples and users' scripts use are taken apart the way each program
reads its own command line: `python[3[.x]] [-u ...] -m MODULE | FILE`, `uv run [options]`,
`torchrun [options]`, `ray job submit [options] -- ...`, `accelerate launch`, `deepspeed`,
`env K=V`, `nohup`, `exec`, `time`, `nice`, `srun`, `mpirun` / `mpiexec`, whether written out
or held in an array (`"${LAUNCH[@]}"`). What follows the module or file is the program's own
argv: for verl, Hydra overrides and Hydra's options.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from rlprobe_patch.launch.shell import Field, Reading, Run

_PYTHON = re.compile(r"(^|/)python(\d+(\.\d+)?)?$")
# Options that take a value, per launcher (the value is the next word unless written `--opt=value`).
_VALUE_OPTIONS: dict[str, set[str]] = {
    "python": {"-W", "-X", "-c"},
    "uv": {
        "--with",
        "--with-requirements",
        "--with-editable",
        "--extra",
        "--group",
        "--no-group",
        "--package",
        "--project",
        "--directory",
        "--python",
        "-p",
        "--index",
        "--default-index",
        "--index-url",
        "--extra-index-url",
        "--env-file",
        "--cache-dir",
        "--config-file",
        "--only-group",
        "-w",
        "--find-links",
    },
    "torchrun": {
        "--nnodes",
        "--nproc_per_node",
        "--nproc-per-node",
        "--node_rank",
        "--node-rank",
        "--master_addr",
        "--master-addr",
        "--master_port",
        "--master-port",
        "--rdzv_backend",
        "--rdzv-backend",
        "--rdzv_endpoint",
        "--rdzv-endpoint",
        "--rdzv_id",
        "--rdzv-id",
        "--rdzv_conf",
        "--rdzv-conf",
        "--max_restarts",
        "--max-restarts",
        "--monitor_interval",
        "--monitor-interval",
        "--start_method",
        "--start-method",
        "--role",
        "--log_dir",
        "--log-dir",
        "-r",
        "--redirects",
        "-t",
        "--tee",
        "--local_addr",
        "--local-addr",
        "--logs_specs",
        "--logs-specs",
        "--local-ranks-filter",
        "--local_ranks_filter",
    },
    "accelerate": {"--config_file", "--config-file", "--num_processes", "--num_machines", "--main_process_port"},
    "deepspeed": {"--num_gpus", "--num_nodes", "--hostfile", "--include", "--exclude", "--master_port"},
    "env": {"-u", "--unset", "-C", "--chdir", "-S"},
    "nice": {"-n", "--adjustment"},
    "srun": {"-N", "-n", "-p", "-c", "-t", "-J", "-w", "--nodes", "--ntasks", "--partition", "--gres"},
    "mpirun": {"-n", "-np", "-H", "--host", "-x", "--hostfile", "-N", "--map-by", "--bind-to"},
}
_PREFIXES = ("nohup", "exec", "time", "setsid", "stdbuf", "numactl", "command")


@dataclass
class Launch:
    """One Python program started by the script."""

    run: Run
    entry: str  # "verl.trainer.main_ppo" or a file path
    module: bool  # `-m MODULE` (else a file)
    args: list[Field]  # the program's argv after the module or file
    launcher: tuple[str, ...]  # the programs that wrap it ("uv run", "torchrun", "python3")
    env: dict[str, Field]

    @property
    def is_verl(self) -> bool:
        if self.module:
            return self.entry.startswith(("verl.", "recipe."))
        parts = Path(self.entry).parts
        return "verl" in parts or "recipe" in parts or Path(self.entry).name.startswith("main_")

    @property
    def source(self) -> str:
        return f"{self.run.file.name}:{self.run.line}"


def launches(reading: Reading) -> list[Launch]:
    found = []
    for run in reading.runs:
        launch = parse_launch(run)
        if launch is not None:
            found.append(launch)
    return found


def _skip_options(argv: list[Field], i: int, program: str) -> int:
    """Index of the first word after `program`'s own options (starting at `i`)."""
    takes_value = _VALUE_OPTIONS.get(program, set())
    while i < len(argv):
        text = argv[i].text
        if text == "--":
            return i + 1
        if not text.startswith("-") or text == "-":
            return i
        if program in ("python", "torchrun") and text in ("-m", "-c"):
            return i
        if "=" not in text and text in takes_value:
            i += 1
        i += 1
    return i


def parse_launch(run: Run) -> Launch | None:
    argv = run.argv
    env = dict(run.env)
    launcher: list[str] = []
    i = 0
    while i < len(argv):
        name = argv[i].text
        base = Path(name).name
        if base in _PREFIXES:
            launcher.append(base)
            i = _skip_options(argv, i + 1, base)
            continue
        if base == "env":
            i = _skip_options(argv, i + 1, "env")
            while i < len(argv) and re.match(r"^[A-Za-z_]\w*=", argv[i].text):
                key, _, value = argv[i].text.partition("=")
                env[key] = Field(value, argv[i].file, argv[i].line, argv[i].unresolved)
                i += 1
            launcher.append("env")
            continue
        if base == "uv" and i + 1 < len(argv) and argv[i + 1].text == "run":
            launcher.append("uv run")
            i = _skip_options(argv, i + 2, "uv")
            continue
        if base == "ray" and argv[i + 1 : i + 3] and [f.text for f in argv[i + 1 : i + 3]] == ["job", "submit"]:
            rest = [f.text for f in argv[i + 3 :]]
            if "--" not in rest:
                return None
            launcher.append("ray job submit")
            i = i + 3 + rest.index("--") + 1
            continue
        if base in ("srun", "mpirun", "mpiexec"):
            launcher.append(base)
            i = _skip_options(argv, i + 1, "mpirun" if base == "mpiexec" else base)
            continue
        if base in ("torchrun", "accelerate", "deepspeed") or (
            _PYTHON.search(name)
            and argv[i + 1 : i + 3]
            and argv[i + 1].text == "-m"
            and argv[i + 2].text in ("torch.distributed.run", "torch.distributed.launch")
        ):
            program = base if base in ("accelerate", "deepspeed") else "torchrun"
            launcher.append(program if program != "accelerate" else "accelerate launch")
            start = i + (2 if base == "accelerate" else 1) if not _PYTHON.search(name) else i + 3
            j = _skip_options(argv, start, program)
            if j < len(argv) and argv[j].text == "-m" and j + 1 < len(argv):  # torchrun -m module
                return Launch(run, argv[j + 1].text, True, argv[j + 2 :], tuple(launcher), env)
            if j < len(argv):
                return Launch(run, argv[j].text, False, argv[j + 1 :], tuple(launcher), env)
            return None
        if _PYTHON.search(name):
            launcher.append(base)
            j = _skip_options(argv, i + 1, "python")
            if j < len(argv) and argv[j].text == "-m" and j + 1 < len(argv):
                return Launch(run, argv[j + 1].text, True, argv[j + 2 :], tuple(launcher), env)
            if j < len(argv) and argv[j].text.endswith(".py"):
                return Launch(run, argv[j].text, False, argv[j + 1 :], tuple(launcher), env)
            return None
        return None
    return None
