"""Clients with their own jax-triton-style `triton_kernel_call` primitive (jax-triton 0.3 and 0.4,
ejKernel).

We register a lowering rule for their primitive that lowers through `rule.lower_call`, so every
binding of their `triton_call`, made before or after, reaches it. Scalars keep the Triton type the
client gave them (jax-triton 0.3 types Python floats as fp64), so the kernels are the client's own.
Where the client's DCE rule takes fewer arguments than this JAX passes (JAX 0.12 added the inputs'
liveness), it is adapted first, so a client we then decline still traces on its own path.
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np
from jax.interpreters import mlir

import compiler

from .. import jax_compat
from ..compile_ahead import ahead
from ..frontend.api import grid_param, zeroed_param
from ..payload import jaxlib_compat as compat
from ..planning.bound_call import FrozenItems
from .served import UnsupportedCall, UnsupportedClient, check_configuration, check_version, serve

# The parameters both clients' lowering rules name (everything else is a metaparameter).
COMMON_PARAMS = frozenset({
    "fn", "scalar_args", "name", "custom_call_target_name", "out_shapes", "grid", "num_warps", "num_stages",
    "num_ctas", "compute_capability", "enable_fp_fusion", "input_output_aliases", "zeroed_outputs", "debug",
    "serialized_metadata"})
_TARGETS = {compat.LEGACY_TARGET: "", compat.FFI_TARGET: compat.FFI_TARGET}


class PrimitiveClient(NamedTuple):
    name: str  # as KERNEL_CACHE_INTERCEPT spells it
    distribution: str  # the pip package, for its version
    lowest: tuple[int, ...]  # versions known to work: [lowest, below)
    below: tuple[int, ...]
    params: frozenset[str]  # the keyword parameters of its lowering rule (besides **metaparams)
    # (client, module, its primitive's parameters, the lowering's ctx) -> rule.lower_call's parameters
    translate: Callable[["PrimitiveClient", ModuleType, dict[str, Any], Any], dict[str, Any]] = (
        lambda client, module, params, ctx: translate(client, params))
    # (platform, the module's target function its rule takes)
    backends: tuple[tuple[str, str], ...] = (("cuda", "get_cuda_backend"), ("rocm", "get_hip_backend"))


def install(client: PrimitiveClient, module: ModuleType) -> None:
    """Replace `module`'s primitive lowering rules (cuda, rocm) with ours; theirs is the fallback."""
    if getattr(module, "triton_kernel_call_p", None) is not None:
        jax_compat.adapt_foreign_dce_rule(module.triton_kernel_call_p)
    check_version(client.name, client.distribution, client.lowest, client.below)
    primitive, lowering = module.triton_kernel_call_p, module.triton_kernel_call_lowering
    signature = inspect.signature(lowering).parameters.values()
    keywords = {p.name for p in signature if p.kind == p.KEYWORD_ONLY}
    if keywords != client.params:
        extra, missing = sorted(keywords - client.params), sorted(client.params - keywords)
        raise UnsupportedClient(f"{client.name}'s triton_kernel_call lowering rule takes parameters kernel-cache "
                                f"does not expect (new: {extra or 'none'}, gone: {missing or 'none'})")
    check_configuration()
    for platform, backend in client.backends:
        own = functools.partial(lowering, getattr(module, backend))
        mlir.register_lowering(primitive, functools.partial(_lower, client, module, platform, own), platform=platform)
    _note_binds(client, module, primitive)


def _note_binds(client: PrimitiveClient, module: ModuleType, primitive: Any) -> None:
    """Binding the client's primitive notes the call for compile-ahead, translated only if a miss
    starts the compiles."""
    if getattr(primitive.bind, "_kernel_cache_notes", False):
        return
    bind = primitive.bind
    translated = functools.partial(_translated, client, module)

    def noting_bind(*args: Any, **params: Any) -> Any:
        if not any(jax_compat.is_ref(a) for a in args):
            ahead.note(args, params, translated)
        return bind(*args, **params)

    noting_bind._kernel_cache_notes = True  # type: ignore[attr-defined]
    primitive.bind = noting_bind


def _translated(client: PrimitiveClient, module: ModuleType, avals_in: Any,
                params: Any) -> tuple[Any, dict[str, Any]]:
    return avals_in, client.translate(client, module, dict(params), types.SimpleNamespace(avals_in=avals_in))


def _lower(client: PrimitiveClient, module: ModuleType, platform: str, own: Any, ctx: Any, *operands: Any,
           **params: Any) -> Any:
    return serve(client.name, params["fn"], platform, ctx, operands,
                 lambda: client.translate(client, module, params, ctx), lambda: own(ctx, *operands, **params),
                 noted=params)


def translate(client: PrimitiveClient, params: dict[str, Any]) -> dict[str, Any]:
    """The client's primitive parameters as `rule.lower_call` takes them."""
    known = {k: v for k, v in params.items() if k in client.params}
    metaparams = {k: v for k, v in params.items() if k not in client.params}
    target = known["custom_call_target_name"]
    if target not in _TARGETS:
        raise UnsupportedCall(f"custom_call_target_name={target!r} is not a target kernel-cache emits")
    return dict(
        kernel=known["fn"],
        scalars=tuple((int(i), client_scalar(dtype, value)) for i, dtype, value in known["scalar_args"]),
        out_avals=tuple((tuple(s.shape), np.dtype(s.dtype)) for s in known["out_shapes"]),
        grid=grid_param(known["grid"]), name=known["name"], num_warps=known["num_warps"],
        num_stages=known["num_stages"], num_ctas=known["num_ctas"] if known["num_ctas"] is not None else 1,
        compute_capability=known["compute_capability"], enable_fp_fusion=known["enable_fp_fusion"],
        backend_options=FrozenItems(), input_output_aliases=FrozenItems(sorted((int(i), int(o))
                                                                              for i, o in known["input_output_aliases"])),
        zeroed_outputs=zeroed_param(known["zeroed_outputs"]), debug=bool(known["debug"]),
        serialized_metadata=bytes(known["serialized_metadata"] or b""),
        metaparams=FrozenItems(sorted(metaparams.items())), has_side_effect=False,
        # Their default is the legacy target; ours picks the CUDA-graph-capturable one for plain calls.
        custom_call_target=_TARGETS[target])


def client_scalar(dtype: str, value: Any) -> Any:
    """A scalar as the client typed it: plain where Triton would type it the same (so ints are
    specialized as Triton does), else a `compiler.Scalar` of the client's type (fp64 floats, u32)."""
    if isinstance(value, bool) or dtype in ("B", "i1"):
        return bool(value)
    if isinstance(value, int) and dtype == compiler.triton_int_type(value):
        return value
    if isinstance(value, float) and dtype == "fp32":
        return value
    if dtype not in compiler.SCALAR_TYPES:
        raise UnsupportedCall(f"a scalar argument of type {dtype!r}")
    return compiler.Scalar(dtype, value)

