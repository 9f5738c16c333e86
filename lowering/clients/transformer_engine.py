"""TransformerEngine's JAX Triton extensions (experimental): `triton_call_lowering`, the helper TE's
primitives lower through (compiling with Triton in every process), replaced in its module and
wherever TE bound it by name with one that lowers through `rule.lower_call`. Gated on the installed
function's signature, not a version; docs/clients.md says how TE's calls are read (constexprs,
in-place kernels, no alignment hint) so that the kernels are TE's own, bit for bit.
"""

from __future__ import annotations

import functools
import inspect
import sys
from types import ModuleType
from typing import Any

import numpy as np

from ..frontend.api import grid_param
from ..planning.aliasing import pointerless_aliases
from ..planning.bound_call import FrozenItems
from ..planning.configs import kernel_name, runtime_param_names, set_by_wrappers
from .served import UnsupportedCall, UnsupportedClient, check_configuration, serve

CLIENT = "transformer_engine"
_REQUIRED = {"ctx", "kernel_fn", "array_args", "grid"}
_OPTIONAL = {"input_output_aliases", "constexprs", "num_warps", "num_stages", "num_ctas", "enable_fp_fusion"}
# TE's launch defaults when its signature names none (TE 2.x: Triton's own; its very first release used 32
# warps and 1 stage, which it dropped as an 8x slowdown); fp fusion off, as TE compiles.
_TE_DEFAULTS = {"num_warps": 4, "num_stages": 3, "num_ctas": 1, "enable_fp_fusion": False}


def install(module: ModuleType) -> None:
    """Entry point `kernel_cache.clients:transformer_engine`; `module` is TE's triton_extensions.utils."""
    own = module.triton_call_lowering
    if getattr(own, "__kernel_cache_client__", None) == CLIENT:
        return
    parameters = inspect.signature(own).parameters
    names = set(parameters)
    if not _REQUIRED <= names or names - _REQUIRED - _OPTIONAL:
        raise UnsupportedClient(f"TE's triton_call_lowering takes ({', '.join(parameters)}), not a signature "
                                f"kernel-cache knows")
    check_configuration()
    defaults = {**_TE_DEFAULTS, **{n: p.default for n, p in parameters.items() if p.default is not p.empty}}
    ours = functools.wraps(own)(functools.partial(_lower, own, defaults))
    ours.__kernel_cache_client__ = CLIENT  # type: ignore[attr-defined]
    for name, loaded in list(sys.modules.items()):  # modules that bound it by name before now
        if loaded is not None and (name == module.__name__ or name.startswith("transformer_engine.")) \
                and getattr(loaded, "triton_call_lowering", None) is own:
            loaded.triton_call_lowering = ours  # type: ignore[attr-defined]  # a module: ModuleType declares no such attribute


def _lower(own: Any, defaults: dict[str, Any], ctx: Any, kernel_fn: Any, *array_args: Any, **kwargs: Any) -> Any:
    return serve(CLIENT, kernel_fn, ctx.module_context.platforms[0], ctx, array_args,
                 lambda: _translate(ctx, kernel_fn, defaults, kwargs), lambda: own(ctx, kernel_fn, *array_args, **kwargs))


def _translate(ctx: Any, kernel_fn: Any, defaults: dict[str, Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(kwargs) - _OPTIONAL - {"grid"})
    if unknown:
        raise UnsupportedCall(f"keyword {', '.join(unknown)} of triton_call_lowering is not one kernel-cache lowers")
    if "grid" not in kwargs:
        raise UnsupportedCall("a call without grid=")
    args = {**defaults, **kwargs}
    constexprs = dict(args.get("constexprs") or {})
    # TE: an autotune config's values win over the caller's constexprs (which carry a fallback
    # BLOCK_SIZE for the grid); jax-triton would instead prune the configs that disagree
    for name in set_by_wrappers(kernel_fn):
        constexprs.pop(name, None)
    aliases = sorted((int(i), int(o)) for i, o in dict(args.get("input_output_aliases") or {}).items())
    name = kernel_name(kernel_fn)
    # TE's in-place kernels take no pointer for their aliased outputs: jax-triton 0.4's reading (no
    # scalars among TE's arrays: same indices)
    try:
        pointerless = pointerless_aliases(name, runtime_param_names(kernel_fn, constexprs), len(ctx.avals_in),
                                          len(ctx.avals_out), aliases)
    except TypeError as exc:
        raise UnsupportedCall(str(exc)) from None
    return dict(
        kernel=kernel_fn, scalars=(), out_avals=tuple((tuple(a.shape), np.dtype(a.dtype)) for a in ctx.avals_out),
        grid=grid_param(args["grid"]), name=name, num_warps=args["num_warps"], num_stages=args["num_stages"],
        num_ctas=args.get("num_ctas") or 1, compute_capability=None, enable_fp_fusion=bool(args["enable_fp_fusion"]),
        backend_options=FrozenItems(), input_output_aliases=FrozenItems(aliases), zeroed_outputs=(), debug=False,
        serialized_metadata=b"", metaparams=FrozenItems(sorted(constexprs.items())), has_side_effect=False,
        custom_call_target="", pointerless_aliases=pointerless, aligned_pointers=False)
