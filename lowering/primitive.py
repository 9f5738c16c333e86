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


# jax-triton's own words (0.3 and 0.4), after ours: code that matches on them keeps working.
JAX_TRITON_NO_AUTODIFF = ("jax_triton.triton_call does not support automatic differentiation. Use jax.custom_jvp or "
                          "jax.custom_vjp to implement a custom automatic differentiation rule for your kernel.")
JAX_TRITON_NO_VMAP = ("jax_triton.triton_call does not support batching with jax.vmap. Use "
                      "jax.custom_batching.custom_vmap to implement a custom batching rule for your kernel.")


def _no_jvp(*_, **params):
    raise NotImplementedError(f"kernel-cache: kernel '{_kernel_name(params)}' cannot be differentiated "
                              f"automatically. {JAX_TRITON_NO_AUTODIFF}")


def _no_vmap(*_, **params):
    raise NotImplementedError(f"kernel-cache: kernel '{_kernel_name(params)}' cannot be batched automatically "
                              f"(or launch a grid over the batch inside the kernel). {JAX_TRITON_NO_VMAP}")


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
