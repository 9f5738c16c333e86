"""The `triton_kernel_call` JAX primitive: abstract eval, eager impl, and refusals for jvp/vmap.

Lowering rules are registered by `lowering.rule` for cuda and rocm.
"""

from __future__ import annotations

import functools

from jax._src import core, dispatch
from jax.extend.core import Primitive
from jax.interpreters import ad, batching
from jax.interpreters import partial_eval as pe

triton_kernel_call_p = Primitive("triton_kernel_call")
triton_kernel_call_p.multiple_results = True
triton_kernel_call_p.def_impl(functools.partial(dispatch.apply_primitive, triton_kernel_call_p))


@triton_kernel_call_p.def_abstract_eval
def _abstract_eval(*avals_in, out_avals, **_):
    return [core.ShapedArray(shape, dtype) for shape, dtype in out_avals]


def _no_jvp(*_, **params):
    raise NotImplementedError(
        f"triton_call of kernel '{_kernel_name(params)}' cannot be differentiated automatically: wrap "
        f"it in jax.custom_vjp (or jax.custom_jvp) and give it a backward kernel")


def _no_vmap(*_, **params):
    raise NotImplementedError(
        f"triton_call of kernel '{_kernel_name(params)}' cannot be batched automatically: wrap it in "
        f"jax.custom_batching.custom_vmap, or launch a grid over the batch inside the kernel")


def _kernel_name(params) -> str:
    kernel = params.get("kernel")
    while kernel is not None and not hasattr(kernel, "__name__") and hasattr(kernel, "fn"):
        kernel = kernel.fn
    return getattr(kernel, "__name__", "?")


def _dce(used_outputs, eqn):
    """Unused outputs may drop the call, unless it has side effects or writes into an input."""
    if any(used_outputs) or eqn.params["has_side_effect"] or eqn.params["input_output_aliases"]:
        return [True] * len(eqn.invars), eqn
    return [False] * len(eqn.invars), None


if hasattr(pe, "dce_rules"):  # jax >= 0.4.x exposes DCE rules here
    pe.dce_rules[triton_kernel_call_p] = _dce
ad.primitive_jvps[triton_kernel_call_p] = _no_jvp
batching.primitive_batchers[triton_kernel_call_p] = _no_vmap
