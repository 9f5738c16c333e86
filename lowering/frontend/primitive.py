"""The `triton_kernel_call` JAX primitive: abstract eval, eager impl, Ref discharge, never-DCE,
and refusals for jvp/vmap.

`jax.Ref` operands (jax-triton 0.4) are written in place: the call declares a read and a write
effect per Ref, and discharged (before lowering) it becomes a pure call with one more output per
Ref, aliased to that operand and given no pointer of its own (`lowering.planning.aliasing`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import jax
import numpy as np
from jax._src import core, dispatch
from jax._src.core import Primitive  # jax.extend.core's, without jax.extend's slow import of Pallas
from jax.interpreters import ad, batching

from .. import jax_compat
from ..planning.bound_call import FrozenItems
from ..planning.configs import kernel_name

triton_kernel_call_p = Primitive("triton_kernel_call")
triton_kernel_call_p.multiple_results = True


def _impl(*args: Any, **params: Any) -> Any:
    if any(jax_compat.is_ref(a) for a in args):  # Refs are discharged inside a jit
        return jax.jit(functools.partial(triton_kernel_call_p.bind, **params))(*args)
    return dispatch.apply_primitive(triton_kernel_call_p, *args, **params)  # type: ignore[no-untyped-call]  # jax's


triton_kernel_call_p.def_impl(_impl)  # type: ignore[no-untyped-call]  # Primitive's methods are unannotated in jax


@triton_kernel_call_p.def_effectful_abstract_eval  # type: ignore[untyped-decorator]  # (as def_impl)
def _abstract_eval(*avals_in: Any, out_avals: Any, **_: Any) -> tuple[list[Any], set[Any]]:
    return [core.ShapedArray(shape, dtype) for shape, dtype in out_avals], jax_compat.ref_effects(avals_in)


def _discharge(in_avals: Sequence[Any], out_avals: Sequence[Any], operands: Sequence[Any],
               params: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    """The call with its Refs' values as inputs and one more output per Ref, aliased to it."""
    refs = [i for i, aval in enumerate(in_avals) if jax_compat.is_ref_aval(aval)]
    extra = tuple((tuple(in_avals[i].shape), np.dtype(in_avals[i].dtype)) for i in refs)
    first = len(params["out_avals"])
    aliases = FrozenItems(sorted((*params["input_output_aliases"].items(), *((i, first + k) for k, i in enumerate(refs)))))
    outs = triton_kernel_call_p.bind(*operands, **{**params, "out_avals": params["out_avals"] + extra,  # type: ignore[no-untyped-call]  # (as def_impl)
                                                   "input_output_aliases": aliases, "pointerless_aliases": True})
    new_values: list[Any] = [None] * len(in_avals)
    for k, i in enumerate(refs):
        new_values[i] = outs[first + k]
    return new_values, list(outs[:first])


jax_compat.register_discharge_rule(triton_kernel_call_p, _discharge)


# jax-triton's own words (0.3 and 0.4), after ours: code that matches on them keeps working.
JAX_TRITON_NO_AUTODIFF = ("jax_triton.triton_call does not support automatic differentiation. Use jax.custom_jvp or "
                          "jax.custom_vjp to implement a custom automatic differentiation rule for your kernel.")
JAX_TRITON_NO_VMAP = ("jax_triton.triton_call does not support batching with jax.vmap. Use "
                      "jax.custom_batching.custom_vmap to implement a custom batching rule for your kernel.")


def _refusal(what: str, theirs: str) -> Callable[..., NoReturn]:
    def refuse(*_: Any, **params: Any) -> NoReturn:
        raise NotImplementedError(f"kernel-cache: kernel '{kernel_name(params.get('kernel'))}' cannot be {what}. {theirs}")
    return refuse


def _never_dce(used_outputs: Sequence[bool], eqn: Any) -> tuple[list[bool], Any]:
    """A Triton call stays even when its outputs are unused (jax-triton 0.4's rule): it may write
    into an aliased input or a Ref, or have side effects JAX cannot see."""
    return [True] * len(eqn.invars), eqn


jax_compat.register_dce_rule(triton_kernel_call_p, _never_dce)
ad.primitive_jvps[triton_kernel_call_p] = _refusal("differentiated automatically", JAX_TRITON_NO_AUTODIFF)
batching.primitive_batchers[triton_kernel_call_p] = _refusal(
    "batched automatically (or launch a grid over the batch inside the kernel)", JAX_TRITON_NO_VMAP)
