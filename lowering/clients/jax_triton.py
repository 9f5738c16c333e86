"""jax-triton 0.3.x and 0.4.x: its `triton_kernel_call` primitive lowered through kernel-cache.

0.3 binds scalars, outputs and aliases as parameters of their own (`primitive_client.translate`).
0.4 binds one pytree (`in_tree`) of the kernel's runtime parameters in order: arrays, static scalars
(`_StaticArg`), tuples of them and output placeholders (`_OutputPlaceholder`) for the outputs that
get a pointer (`jax.Ref` arguments are such aliases once discharged). Which one is installed is
decided by what its lowering rule takes; calls kernel-cache cannot express (outputs before inputs, a
descriptor where jaxlib or Triton lacks them) go to jax-triton's own lowering with one warning.
"""

from __future__ import annotations

import inspect
from types import ModuleType
from typing import Any

import numpy as np
from jax import tree_util

from .. import tensor_descriptor
from ..frontend.api import LAUNCH_KEYS, cost_estimate_param, grid_param, zeroed_param
from ..planning import aliasing
from ..planning.bound_call import FrozenItems
from ..tensor_descriptor import TensorDescriptor
from . import primitive_client
from .primitive_client import COMMON_PARAMS, PrimitiveClient, client_scalar
from .served import UnsupportedCall


def translate_04(client: PrimitiveClient, module: ModuleType, params: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """jax-triton 0.4's primitive parameters as `rule.lower_call` takes them."""
    inputs, outputs = _parameters(module, params["in_tree"], ctx.avals_in)
    # _StaticArg is a pytree node without children: a leaf here, where its scalar goes
    flat, tree = tree_util.tree_flatten(inputs, is_leaf=lambda a: isinstance(a, module._StaticArg))
    scalar_args = [(operand, client_scalar(module.get_type_id(leaf.value), leaf.value))
                   for operand, leaf in enumerate(flat) if isinstance(leaf, module._StaticArg)]
    out_shapes = params["out_shapes"]
    aliases = {int(i): int(o) for i, o in params["input_output_aliases"].items()}
    unaliased = [o for o in range(len(out_shapes)) if o not in set(aliases.values())]
    if outputs != unaliased:
        raise UnsupportedCall(f"output placeholders {outputs} are not the unaliased outputs in order")
    options = dict(params["backend_options"])
    launch = {key: options.pop(key, default) for key, default in zip(LAUNCH_KEYS, (4, 3, 1))}
    debug = bool(options.pop("debug", False))
    enable_fp_fusion = options.pop("enable_fp_fusion", True)
    metaparams = dict(params["metaparams"])
    return dict(
        kernel=params["fn"], scalars=tuple(scalar_args),
        out_avals=tuple((tuple(s.shape), np.dtype(s.dtype)) for s in out_shapes),
        grid=grid_param(params["grid"]), name=params["name"], **launch,
        compute_capability=params["compute_capability"], enable_fp_fusion=enable_fp_fusion,
        backend_options=FrozenItems(sorted(options.items())),
        input_output_aliases=FrozenItems(aliasing.array_indices(sorted(aliases.items()), [p for p, _ in scalar_args],
                                                                len(flat))),
        zeroed_outputs=zeroed_param(params["zeroed_outputs"]), debug=debug,
        serialized_metadata=bytes(params["serialized_metadata"] or b""),
        metaparams=FrozenItems(sorted(metaparams.items())), has_side_effect=bool(params["has_side_effect"]),
        custom_call_target="", pointerless_aliases=True,
        cost_estimate=cost_estimate_param(params["cost_estimate"]),
        arg_tree=tree if any(isinstance(p, (tuple, TensorDescriptor)) for p in inputs) else None)


def _parameters(module: ModuleType, in_tree: Any, avals_in: Any) -> tuple[list[Any], list[int]]:
    """(the kernel's input parameters in order, a tuple parameter as a tuple; the output placeholders'
    ordinals, which must all come after the inputs)."""
    descriptor = getattr(module, "TensorDescriptor", None)
    leaves = (module._StaticArg, module._OutputPlaceholder, *([descriptor] if descriptor is not None else []))
    inputs: list[Any] = []
    outputs: list[int] = []
    for value in in_tree.unflatten(list(avals_in)):
        if isinstance(value, module._OutputPlaceholder):
            outputs.append(value.ordinal)
            continue
        if outputs:
            raise UnsupportedCall("an output parameter before an input (kernel-cache passes outputs last)")
        for part in tree_util.tree_leaves(value, is_leaf=lambda a: isinstance(a, leaves)):
            if descriptor is not None and isinstance(part, descriptor) and not tensor_descriptor.supported():
                raise UnsupportedCall("a TensorDescriptor argument (host-side TMA), which this jaxlib or Triton lacks")
            if isinstance(part, module._OutputPlaceholder):
                raise UnsupportedCall("an output placeholder inside a tuple")
        inputs.append(tree_util.tree_map(lambda a: _ours(a, descriptor), value, is_leaf=lambda a: isinstance(a, leaves)))
    return inputs, outputs


def _ours(value: Any, descriptor: Any) -> Any:
    if descriptor is None or not isinstance(value, descriptor):
        return value
    return TensorDescriptor(value.base, tuple(value.shape), tuple(value.strides), tuple(value.block_shape),
                            value.layout, value.padding, bool(value.round_f32_to_tf32))


V03 = PrimitiveClient(name="jax_triton", distribution="jax-triton", lowest=(0, 3), below=(0, 4),
                      params=COMMON_PARAMS)
V04 = PrimitiveClient(name="jax_triton", distribution="jax-triton", lowest=(0, 4), below=(0, 5),
                      params=frozenset({"fn", "name", "in_tree", "out_shapes", "grid", "compute_capability",
                                        "backend_options", "input_output_aliases", "zeroed_outputs",
                                        "serialized_metadata", "metaparams", "has_side_effect", "cost_estimate"}),
                      translate=translate_04, backends=(("cuda", "make_cuda_target"), ("rocm", "make_hip_target")))


def install(module: ModuleType) -> None:
    """Entry point `kernel_cache.clients:jax_triton`; `module` is jax_triton.triton_lib, 0.3 or 0.4
    by what its lowering rule takes (`in_tree`: 0.4)."""
    takes = inspect.signature(module.triton_kernel_call_lowering).parameters
    primitive_client.install(V04 if "in_tree" in takes else V03, module)
