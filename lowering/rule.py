"""The lowering rule: configs -> specs -> artifacts from the store -> one custom call.

No Triton compile happens here when the store is warm: every kernel comes from `kernel_cache` by
content key (see `lowering.kernels`).
"""

from __future__ import annotations

import functools

import numpy as np
from jax.interpreters import mlir

from . import custom_call, devices, kernels, winners
from .configs import named_args, normalize_grid, per_config, resolve_configs
from .primitive import triton_kernel_call_p
from .target_arch import resolve_target


def _runtime_values(in_avals, scalars, out_avals) -> list:
    """Inputs with the scalars at their positions, then the outputs: the positional runtime args."""
    values = list(in_avals)
    for position, value in scalars:
        values.insert(position, value)
    return values + list(out_avals)


def _lower(platform: str, ctx, *operands, **params):
    return lower_call(platform, ctx, *operands, **params)


def lower_call(platform: str, ctx, *operands, kernel, scalars, out_avals, grid, name, num_warps, num_stages,
           num_ctas, compute_capability, enable_fp_fusion, backend_options, input_output_aliases,
           zeroed_outputs, debug, serialized_metadata, metaparams, has_side_effect, custom_call_target=""):
    devices.check_lowering_context(ctx)
    metaparams = dict(metaparams)
    target = resolve_target(platform, compute_capability)
    named = named_args(kernel, _runtime_values(ctx.avals_in, scalars, ctx.avals_out), metaparams)
    runtime_names = list(named)  # the bound parameters, in the kernel's order (before any prune function sees them)
    fn, configs = resolve_configs(kernel, named, metaparams, num_warps=num_warps, num_stages=num_stages,
                                  num_ctas=num_ctas)
    args = kernels.runtime_args([a.dtype for a in ctx.avals_in], scalars, [a.dtype for a in ctx.avals_out])
    options = {"enable_fp_fusion": enable_fp_fusion, "debug": debug, **dict(backend_options)}
    specs = kernels.specs_for(fn, args, configs, target, options)
    chosen = winners.choose(platform, kernel, specs, configs, named, metaparams, ctx.avals_in, ctx.avals_out)
    if chosen is not None:  # a persisted autotune winner: one plain call, no autotuning at launch
        configs, specs = [configs[chosen]], [specs[chosen]]
    fetched = kernels.fetch(specs)

    num_in_args = len(ctx.avals_in) + len(scalars)  # runtime positions before the outputs
    out_sizes = [int(np.prod(a.shape, dtype=np.int64)) * np.dtype(a.dtype).itemsize for a in ctx.avals_out]
    calls = []
    for config, spec, (art, key) in zip(configs, specs, fetched):
        zeroed = per_config(zeroed_outputs, config.constexprs) or ()
        calls.append(custom_call.ConfigCall(
            spec=spec, artifact=art, key=key, grid=normalize_grid(grid, config.constexprs),
            zeroed_bytes={num_in_args + i: out_sizes[i] for i in sorted(zeroed)},
            description=config.description, bound=frozenset(config.constexprs)))

    in_sizes = [int(np.prod(a.shape, dtype=np.int64)) * np.dtype(a.dtype).itemsize for a in ctx.avals_in]
    scalar_desc = str({runtime_names[p]: v for p, v in scalars})
    payload = custom_call.serialized_call(
        platform, calls, args, name=name, kernel_name=fn.__name__, scalar_desc=scalar_desc,
        compute_capability=target.arch if target.backend == "cuda" else 0, aliases=input_output_aliases,
        num_inputs=len(ctx.avals_in), in_sizes=in_sizes, serialized_metadata=serialized_metadata, debug=debug)
    return custom_call.emit(ctx, operands, platform, payload, autotuned=len(calls) > 1, name=name,
                            aliases=input_output_aliases, has_side_effect=has_side_effect,
                            target_name=custom_call_target)


for _platform in ("cuda", "rocm"):
    mlir.register_lowering(triton_kernel_call_p, functools.partial(_lower, _platform), platform=_platform)
