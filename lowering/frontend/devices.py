"""Refuse multi-device calls outside shard_map: a Triton kernel sees one device's buffers only (the
eager check here; the lowering rule's own is `rule.check_lowering_context`). Inside `shard_map` each
device launches the kernel on its own shard; under a plain multi-device `jit`, XLA would have to
partition an opaque custom call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kernel_cache.errors import KernelCacheError

HINT = "call triton_call inside jax.shard_map so that each device runs the kernel on its own shard"


class MultiDeviceError(KernelCacheError, ValueError):
    """A Triton call would span several devices outside shard_map."""


def check_arrays(arrays: Sequence[Any]) -> None:
    first = None
    for index, array in enumerate(arrays):
        sharding = getattr(array, "sharding", None)
        device_set = getattr(sharding, "device_set", None)
        if not device_set:
            continue  # a tracer or a NumPy array: checked at lowering time
        if len(device_set) > 1:
            raise MultiDeviceError(f"triton_call argument {index} is sharded over {len(device_set)} "
                                   f"devices; {HINT}")
        device = next(iter(device_set))
        if first is None:
            first = (index, device)
        elif device != first[1]:
            raise MultiDeviceError(f"triton_call arguments {first[0]} and {index} are on different devices "
                                   f"({first[1]} and {device}); put them on one device or {HINT}")
