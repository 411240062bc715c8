"""For dry runs of megatron_bench.py on a machine without a GPU (never used on the GPU).

megatron-core calls `torch.cuda.*` directly (RNG tracker, current_device, streams) where
verl goes through its device layer. On a CPU build of torch these raise, so a dry run
points them at the CPU. This only lets the driver's own code paths (config, bridge, model
build, engine wiring, the hooks) be exercised here before device time is spent; the
numbers it gives mean nothing, and run_gpu.sh never imports it.
"""

from __future__ import annotations

import contextlib

import torch


def install() -> list[str]:
    if torch.cuda.is_available():
        return []
    cuda = torch.cuda
    done = []

    def setattr_(name, value):
        setattr(cuda, name, value)
        done.append(name)

    setattr_("get_rng_state", lambda device=None: torch.get_rng_state())
    setattr_("set_rng_state", lambda state, device=None: torch.set_rng_state(state))
    setattr_("manual_seed", lambda seed: None)
    setattr_("manual_seed_all", lambda seed: None)
    setattr_("current_device", lambda: "cpu")
    setattr_("device_count", lambda: 1)
    setattr_("synchronize", lambda device=None: None)
    setattr_("empty_cache", lambda: None)
    setattr_("is_initialized", lambda: True)
    setattr_("memory_allocated", lambda device=None: 0)
    setattr_("max_memory_allocated", lambda device=None: 0)
    setattr_("memory_reserved", lambda device=None: 0)
    setattr_("max_memory_reserved", lambda device=None: 0)

    class _Stream:
        def __init__(self, *a, **k):
            pass

        def wait_stream(self, *a, **k):
            pass

        def synchronize(self):
            pass

        def record_event(self, *a, **k):
            return None

    setattr_("Stream", _Stream)
    setattr_("current_stream", lambda device=None: _Stream())
    setattr_("default_stream", lambda device=None: _Stream())
    setattr_("stream", lambda s=None: contextlib.nullcontext())
    torch.nn.Module.cuda = lambda self, device=None: self
    torch.Tensor.cuda = lambda self, device=None, non_blocking=False, **k: self
    done += ["torch.nn.Module.cuda", "torch.Tensor.cuda"]

    def cpu_device(factory):
        def wrapper(*a, **k):
            dev = k.get("device")
            if dev is not None and str(dev).startswith("cuda"):
                k["device"] = "cpu"
            k.pop("pin_memory", None)
            return factory(*a, **k)

        return wrapper

    for name in (
        "tensor",
        "zeros",
        "ones",
        "empty",
        "full",
        "arange",
        "randn",
        "rand",
        "randint",
        "as_tensor",
        "zeros_like",
        "ones_like",
        "empty_like",
        "full_like",
    ):
        setattr(torch, name, cpu_device(getattr(torch, name)))
        done.append(f"torch.{name}(device='cuda')")
    orig_to = torch.Tensor.to

    def to(self, *a, **k):
        if a and isinstance(a[0], (str, torch.device)) and str(a[0]).startswith("cuda"):
            a = ("cpu",) + a[1:]
        if str(k.get("device", "")).startswith("cuda"):
            k["device"] = "cpu"
        return orig_to(self, *a, **k)

    torch.Tensor.to = to
    orig_type = torch.Tensor.type

    def type_(self, *a, **k):  # megatron's optimizer insists on torch.cuda.*Tensor parameters
        r = orig_type(self, *a, **k)
        if not a and not k and isinstance(r, str) and r.startswith("torch.") and not r.startswith("torch.cuda."):
            return "torch.cuda." + r[len("torch.") :]
        return r

    torch.Tensor.type = type_

    import megatron.core.tensor_parallel.random as mrandom

    mrandom._set_cuda_rng_state = lambda *a, **k: None
    mrandom._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    done.append("megatron.core.tensor_parallel.random._set_cuda_rng_state")
    return done
