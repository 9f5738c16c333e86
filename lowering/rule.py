"""The lowering rule: configs -> specs -> artifacts from the store -> one custom call.

No Triton compile happens here when the store is warm: every kernel comes from `kernel_cache` by
content key (see `lowering.kernels`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from jax.interpreters import mlir

from . import ahead, call_records, custom_call, devices, kernels, winners
from .aliasing import OutputOrder
from .bound_call import BoundCall
from .configs import LaunchConfig, normalize_grid, per_config
from .plan import KernelPlan
from .primitive import triton_kernel_call_p


def _lower(platform: str, ctx: Any, *operands: Any, **params: Any) -> Sequence[Any]:
    with ahead.lowering(ctx.avals_in, params):
        return lower_call(platform, ctx, *operands, **params)


def lower_call(platform: str, ctx: Any, *operands: Any, **params: Any) -> Sequence[Any]:
    """Lower one call (`triton_kernel_call_p`'s parameters, or a client's translated to them)."""
    devices.check_lowering_context(ctx)
    call = BoundCall.of(params)
    plan = KernelPlan.of(platform, ctx.avals_in, ctx.avals_out, call)
    launches = _launches(plan.configs, call.grid, call.zeroed_outputs, ctx.avals_out,
                         _zero_positions(plan.order, call.input_output_aliases, call.scalars, len(ctx.avals_in)))
    info = custom_call.CallInfo(
        name=call.name, kernel_name=plan.fn.__name__,
        scalar_desc=str({plan.leaf_names[p]: v for p, v in call.scalars}),
        compute_capability=int(plan.target.arch) if plan.target.backend == "cuda" else 0,  # an int for cuda
        aliases=plan.aliases, num_inputs=len(ctx.avals_in), in_sizes=tuple(_nbytes(a) for a in ctx.avals_in),
        serialized_metadata=bytes(call.serialized_metadata), debug=call.debug)
    shapes = [(tuple(int(d) for d in a.shape), np.dtype(a.dtype).name) for a in (*ctx.avals_in, *plan.results)]
    slot = call_records.slot(platform, plan, launches, info, shapes, module=getattr(ctx, "module_context", None))
    served = slot.served()  # a call seen before: one store read
    if served is None:
        served = _lower_kernels(platform, slot, call.kernel, plan, launches, info, ctx)
    payload, kernel_count = served
    out = custom_call.emit(ctx, operands, platform, payload, autotuned=kernel_count > 1, call=call,
                           aliases=plan.aliases, avals_out=plan.results)
    return out if plan.order.identity else plan.order.results(out)


def _zero_positions(order: OutputOrder, aliases: Sequence[tuple[int, int]], scalars: Sequence[tuple[int, Any]],
                    num_inputs: int) -> dict[int, int]:
    """{output index: the runtime argument jaxlib zeroes for it}: an output's own pointer (after the
    inputs and scalars), or, for an aliased output without one (jax-triton 0.4), the input's."""
    num_args = num_inputs + len(scalars)
    positions = {o: num_args + k for k, o in enumerate(order.order[:order.pointers])}
    scalar_at = {p for p, _ in scalars}
    array_at = [p for p in range(num_args) if p not in scalar_at]  # array i's runtime position
    for i, o in aliases:
        positions.setdefault(int(o), array_at[int(i)])
    return positions


def _nbytes(aval: Any) -> int:
    return math.prod(int(d) for d in aval.shape) * int(np.dtype(aval.dtype).itemsize)


def _launches(configs: Sequence[LaunchConfig], grid: Any, zeroed_outputs: Any, avals_out: Sequence[Any],
              positions: dict[int, int]) -> list[custom_call.Launch]:
    """Each config's grid, zeroed outputs (by runtime position, `positions`) and description."""
    out_sizes = [_nbytes(a) for a in avals_out]
    launches = []
    for config in configs:
        zeroed = per_config(zeroed_outputs, config.constexprs) or ()
        launches.append(custom_call.Launch(
            grid=normalize_grid(grid, config.constexprs),
            zeroed_bytes={positions[i]: out_sizes[i] for i in sorted(zeroed)},
            description=config.description, bound=frozenset(config.constexprs)))
    return launches


def _lower_kernels(platform: str, slot: call_records.Slot, kernel: Any, plan: KernelPlan,
                   launches: list[custom_call.Launch], info: custom_call.CallInfo, ctx: Any) -> tuple[bytes, int]:
    """The payload built kernel by kernel (specs, content keys, store reads or compiles), then recorded.
    The first miss starts the compiles of every other call traced so far (`ahead`)."""
    configs, specs = plan.configs, plan.specs()
    choice = winners.choose(platform, kernel, specs, configs, plan.named, plan.metaparams, ctx.avals_in,
                            ctx.avals_out)
    if choice.index is not None:  # a persisted autotune winner: one plain call, no autotuning at launch
        configs, specs, launches = [configs[choice.index]], [specs[choice.index]], [launches[choice.index]]
    fetched = kernels.fetch(specs, on_miss=functools.partial(ahead.start, platform))
    calls = [custom_call.ConfigCall(spec=spec, artifact=art, key=key, launch=launch)
             for spec, (art, key), launch in zip(specs, fetched, launches)]
    payload = custom_call.serialized_call(platform, calls, plan.args, info)
    slot.remember(payload, fetched, choice.family, choice.key, chosen=choice.index is not None)
    return payload, len(calls)


for _platform in ("cuda", "rocm"):
    mlir.register_lowering(triton_kernel_call_p, functools.partial(_lower, _platform), platform=_platform)
