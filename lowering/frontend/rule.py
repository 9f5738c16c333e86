"""The lowering rule: the call served (`call_records.serve`: its record, or its kernels) -> one custom call.

A warm store means no Triton compile here: a call lowered before is one record read, a new call's
kernels come from the store by content key. The rule takes the session once and passes it down.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from jax.interpreters import mlir

import kernel_cache
from kernel_cache.errors import KernelCacheError

from .. import first_use
from ..compile_ahead import ahead
from ..planning import kernels
from ..records import call_records, winners
from . import custom_call
from .primitive import triton_kernel_call_p

HINT = "call triton_call inside jax.shard_map so that each device runs the kernel on its own shard"


class MultiDeviceError(KernelCacheError, ValueError):
    """A Triton call would span several devices outside shard_map."""


def check_arrays(arrays: Sequence[Any]) -> None:
    """Multi-device calls are refused outside shard_map: a Triton kernel sees one device's buffers only
    (inside it each device launches the kernel on its own shard; under a plain multi-device `jit`, XLA
    would have to partition an opaque custom call)."""
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


def _lower(platform: str, ctx: Any, *operands: Any, **params: Any) -> Sequence[Any]:
    return lower_call(platform, ctx, operands, params, noted=params)


def lower_call(platform: str, ctx: Any, operands: Sequence[Any], params: dict[str, Any],
               noted: Mapping[str, Any] | None = None) -> Sequence[Any]:
    """Lower one call (`triton_kernel_call_p`'s parameters, or a client's translated to them). `noted`:
    the parameters its bind noted for compile-ahead (a client's own, before translation)."""
    check_lowering_context(ctx)
    session = kernel_cache.current_session()
    if first_use.STARTED not in session.memos:
        first_use.STARTED.of(session)
    build = functools.partial(_lower_kernels, avals_in=ctx.avals_in, noted=noted)
    shape, payload, kernels = call_records.serve(platform, ctx.avals_in, ctx.avals_out, params, session,
                                                 getattr(ctx, "module_context", None), build)
    return custom_call.emit(ctx, operands, shape, payload, autotuned=kernels > 1)


def _lower_kernels(slot: call_records.Slot, *, avals_in: Sequence[Any], noted: Mapping[str, Any] | None) -> None:
    """The payload built kernel by kernel, then recorded in `slot`. The first miss starts the compiles
    of every other call traced so far (`ahead`)."""
    session = slot.session
    plan, specs, choice = winners.narrowed(slot.plan, session)
    on_miss = functools.partial(ahead.start, plan.platform, session, avals_in, noted)
    fetched = kernels.fetch(specs, session, on_miss=on_miss)
    calls = [custom_call.ConfigCall(spec, art, launch) for spec, (art, _), launch in zip(specs, fetched, plan.launches)]
    payload = custom_call.serialized_call(plan.platform, calls, plan.args, plan.info, session.config)
    slot.remember(payload, fetched, choice.family, choice.key, chosen=choice.config is not None)


def check_lowering_context(ctx: Any) -> None:
    """A program partitioned over several devices must be inside shard_map (`check_arrays`: the eager check)."""
    axis_context = ctx.module_context.axis_context
    manual = getattr(axis_context, "manual_axes", None)
    if manual:  # inside shard_map: per-device code
        return
    num_devices = getattr(axis_context, "num_devices", None)
    if num_devices is None:
        mesh = getattr(axis_context, "mesh", None)
        num_devices = getattr(mesh, "size", None)
    if num_devices is not None and num_devices > 1:
        raise MultiDeviceError(f"triton_call is being lowered for a program spread over {num_devices} "
                               f"devices; {HINT}")


for _platform in ("cuda", "rocm"):
    mlir.register_lowering(triton_kernel_call_p, functools.partial(_lower, _platform), platform=_platform)
