"""A stand-in for `ray`, for the GPU bench only (bench/gpu/README.md says why).

verl imports ray at `import verl` (verl/protocol.py: `import ray`, and annotations such as
`list[ray.ObjectRef]`), but the engines driven here (FSDPEngineWithLMHead,
MegatronEngineWithLMHead) never call it: no cluster, no actors, no object store. The real
ray wheel is about 70 MiB, more than a device call may carry with everything else, so this
module provides the names that are touched at import time and nothing that works: any call
into it raises, so a code path that really needs ray fails loudly instead of silently.
"""

from __future__ import annotations

__version__ = "0.0.0+rlprobe-bench-standin"
STANDIN = True


class RayStandInError(RuntimeError):
    pass


def _refuse(name: str):
    def call(*args, **kwargs):
        raise RayStandInError(f"ray.{name}() called, but this is the bench's ray stand-in (no ray installed)")

    call.__name__ = name
    return call


class ObjectRef:  # isinstance checks and annotations only
    pass


class ActorHandle:
    pass


def remote(*args, **kwargs):
    """`@ray.remote` and `@ray.remote(num_gpus=...)`: return the class or function unchanged."""
    if len(args) == 1 and not kwargs and callable(args[0]):
        return args[0]
    return lambda obj: obj


def method(*args, **kwargs):
    if len(args) == 1 and not kwargs and callable(args[0]):
        return args[0]
    return lambda obj: obj


def is_initialized() -> bool:
    return False


get = _refuse("get")
put = _refuse("put")
wait = _refuse("wait")
init = _refuse("init")
get_actor = _refuse("get_actor")
kill = _refuse("kill")
nodes = _refuse("nodes")
get_runtime_context = _refuse("get_runtime_context")
available_resources = _refuse("available_resources")
cluster_resources = _refuse("cluster_resources")
