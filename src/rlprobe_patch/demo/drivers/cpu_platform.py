"""A CPU platform for verl >= 0.9, so that its FSDP engine runs on a machine without accelerators.

verl 0.9 routes every device question (``get_device_name``, ``get_device_id``,
``get_torch_device``) through ``verl.plugin.platform``, which only knows nvidia,
huawei and amd and falls back to "nvidia" on a CPU-only box; the engine then dies in
``init_device_mesh("cuda")``. This module registers a ``cpu`` platform in verl's own
``PlatformRegistry`` and makes it the current one, through verl's plugin hook:

    VERL_USE_EXTERNAL_MODULES=cpu_platform PYTHONPATH=src/rlprobe_patch/demo/drivers python ...

verl imports the module at the end of ``import verl``, before anything imports
``verl.workers.engine.fsdp.transformer_impl`` (which caches ``get_device_name()`` at
import time). Importing it by hand works as well, as long as that happens first.

verl < 0.9 needs none of this (its ``get_device_name()`` already falls back to
"cpu"), so there the module does nothing.
"""

from __future__ import annotations

import contextlib
import types
from typing import Any

import torch

try:
    from verl.plugin.platform import PlatformBase, PlatformRegistry, set_platform
except ImportError:  # verl < 0.9 has no platform layer and detects the CPU by itself
    PlatformBase = None


def _meminfo_bytes(field: str) -> int:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class CpuDeviceModule(types.ModuleType):
    """``torch.cpu`` plus the ``torch.cuda``-style calls that verl makes on ``get_torch_device()``.

    Memory statistics report zero and cache/fraction calls do nothing: there is no
    device allocator to query. Anything else falls through to ``torch.cpu``.
    """

    def __init__(self) -> None:
        super().__init__("rlprobe_cpu_device")

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def memory_allocated(device: Any = None) -> int:
        return 0

    @staticmethod
    def memory_reserved(device: Any = None) -> int:
        return 0

    @staticmethod
    def max_memory_allocated(device: Any = None) -> int:
        return 0

    @staticmethod
    def max_memory_reserved(device: Any = None) -> int:
        return 0

    @staticmethod
    def reset_peak_memory_stats(device: Any = None) -> None:
        return None

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        return _meminfo_bytes("MemAvailable"), _meminfo_bytes("MemTotal")

    @staticmethod
    def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
        return None

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        torch.manual_seed(seed)

    @staticmethod
    def get_rng_state(device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)


CPU_DEVICE_MODULE = CpuDeviceModule()


if PlatformBase is not None:

    @PlatformRegistry.register(platform="cpu")
    class PlatformCPU(PlatformBase):
        """verl platform whose device is the host CPU and whose collectives use gloo."""

        @property
        def device_name(self) -> str:
            return "cpu"

        @property
        def vendor_name(self) -> str:
            return "cpu"

        @property
        def device_module(self) -> types.ModuleType:
            return CPU_DEVICE_MODULE

        def is_available(self) -> bool:
            return True

        def current_device(self) -> torch.device:
            # not an int: verl does `tensor.to(get_device_id())`, and `.to(0)` means cuda:0
            return torch.device("cpu")

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: Any) -> None:
            return None

        def synchronize(self, device_index: Any = None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0) -> tuple[None, None]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        @contextlib.contextmanager
        def nvtx_range(self, msg: str):
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def ray_resource_name(self) -> str:
            return "CPU"

        def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
            return {}

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self) -> None:
            return None

    def install() -> None:
        """Make the CPU platform verl's current one (idempotent)."""
        from verl.plugin.platform import platform_manager

        current = platform_manager._current_platform
        if not isinstance(current, PlatformCPU):
            set_platform(PlatformCPU())

    install()
