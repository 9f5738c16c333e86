"""`triton_call`: launch a Triton kernel from JAX, with jax-triton's signature (0.3's and 0.4's
keywords: out_shape/out_type, backend_options, has_side_effect, cost_estimate).

Arrays are passed in order, then one pointer per output; Python/NumPy scalars become scalar kernel
arguments fixed at trace time. A keyword whose value is an array and names a runtime parameter is
an operand bound to that parameter (jax-triton 0.4); other keywords are constexprs: a scalar keyword
naming a non-constexpr parameter is compiled in as a constant (jax-triton 0.3; 0.4 passes it at run
time: the results are the same). TensorDescriptor and jax.Ref arguments (0.4) are refused with what
they would need (see lowering.tensor_descriptor).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax import tree_util

from . import devices, tensor_descriptor
from . import jaxlib_compat as compat
from .configs import runtime_param_names
from .primitive import triton_kernel_call_p
from .tensor_descriptor import TensorDescriptor

try:  # jax.Ref's abstract value (jax >= 0.7); None where this JAX has no Refs
    from jax._src.state.types import AbstractRef
except ImportError:  # pragma: no cover - older JAX
    AbstractRef = None

_LAUNCH_KEYS = ("num_warps", "num_stages", "num_ctas")


def _is_scalar(value: Any) -> bool:
    if isinstance(value, (np.complexfloating, np.str_, np.bytes_, np.void)):
        raise TypeError(f"a {type(value).__name__} scalar cannot be passed to a Triton kernel")
    return isinstance(value, (bool, int, float, np.generic))


def _scalar(value: Any) -> Any:
    if isinstance(value, np.generic):
        value = value.item()
    return value


def _hashable_items(mapping: Mapping[str, Any] | None, what: str) -> tuple:
    items = tuple(sorted((mapping or {}).items()))
    try:
        hash(items)
    except TypeError as exc:
        raise TypeError(f"{what} values must be hashable (they are part of the traced call): {exc}") from None
    return items


def grid_param(grid: Any) -> Any:
    if callable(grid):
        return grid
    if isinstance(grid, (list, tuple)):
        return tuple(int(g) for g in grid)
    return int(grid)


def zeroed_param(zeroed: Any) -> Any:
    return zeroed if callable(zeroed) else tuple(int(i) for i in zeroed)


def _refuse_unsupported(args: tuple) -> None:
    """TensorDescriptor and jax.Ref arguments (jax-triton 0.4) fail here, each with what it needs."""
    leaves = tree_util.tree_leaves(args, is_leaf=lambda a: isinstance(a, TensorDescriptor))
    for position, leaf in enumerate(leaves):
        if isinstance(leaf, TensorDescriptor):
            tensor_descriptor.refuse(position)
        if _is_ref(leaf):
            raise TypeError(
                f"argument {position} is a jax.Ref (jax-triton 0.4 writes kernel outputs into Refs in place): "
                f"kernel-cache's triton_call takes arrays; for an in-place kernel pass the array and "
                f"input_output_aliases={{input index: output index}} (the jax-triton 0.3 form)")


def _is_ref(value: Any) -> bool:
    if AbstractRef is None or isinstance(value, (bool, int, float, complex, np.generic)):
        return False  # a scalar (jax.typeof of an int beyond int32 raises on some JAX versions)
    try:
        return isinstance(jax.typeof(value), AbstractRef)
    except Exception:  # not a JAX value at all: whatever it is, it is not a Ref
        return False


def _with_keyword_operands(kernel: Any, flat_args: list, keywords: Mapping[str, Any],
                           metaparams: Mapping[str, Any]) -> list:
    """The positional arguments with the keyword arrays placed at their parameters' positions (the
    runtime parameters in the kernel's order: inputs first, the outputs after them)."""
    constants = {k: v for k, v in metaparams.items() if k not in keywords}
    names = runtime_param_names(kernel, constants)
    unknown = [k for k in keywords if k not in names]
    if unknown:
        raise TypeError(f"keyword {', '.join(repr(k) for k in unknown)} is an array but names no runtime parameter "
                        f"of the kernel ({', '.join(names)}): pass arrays positionally or by a parameter's name")
    inputs = names[:len(flat_args) + len(keywords)]
    late = [k for k in keywords if k not in inputs]
    if late:
        raise TypeError(f"keyword array {', '.join(repr(k) for k in late)} names a parameter after the ones the "
                        f"outputs take ({', '.join(names[len(inputs):])}): kernel-cache launches a kernel's inputs "
                        f"first and its outputs last; pass it positionally or reorder the kernel's parameters")
    positional = iter(flat_args)
    return [keywords[name] if name in keywords else next(positional) for name in inputs]


def triton_call(*args: Any, kernel: Any, out_shape: Any = None, out_type: Any = None, grid: Any,
                name: str = "", num_warps: int | None = None, num_stages: int | None = None,
                num_ctas: int | None = 1, compute_capability: "int | str | None" = None,
                enable_fp_fusion: bool = True, backend_options: Mapping[str, Any] | None = None,
                input_output_aliases: Mapping[int, int] | None = None,
                zeroed_outputs: "Sequence[int] | Callable[[dict], Sequence[int]]" = (),
                debug: bool = False, serialized_metadata: bytes = b"", has_side_effect: bool = False,
                cost_estimate: Any = None, custom_call_target_name: str | None = None, device: int = 0,
                **metaparams: Any) -> Any:
    """Call `kernel` (a @triton.jit function, possibly wrapped by triton.autotune / triton.heuristics).

    out_shape / out_type: a ShapeDtypeStruct or any pytree of objects with .shape and .dtype; the
    result has the same structure. grid: int, tuple of up to 3 ints, or a callable of the
    metaparameters (evaluated per autotune config). input_output_aliases: {input index: output
    index}, counted over array arguments. zeroed_outputs: output indices to zero before launch (or a
    callable of the metaparameters). compute_capability: e.g. 90 (default: the device's).
    backend_options: Triton options; num_warps/num_stages/num_ctas may be given there instead (as in
    jax-triton 0.4). has_side_effect: keep the call even when its outputs are unused.
    cost_estimate: accepted for jax-triton 0.4 compatibility; not used.
    custom_call_target_name (jax-triton 0.3): None picks the CUDA-graph-compatible FFI target where
    the plugin registers it (the legacy one for autotuned calls); "triton_kernel_call" forces the
    legacy target; "triton_kernel_call_ffi" requires the FFI one.
    device (ejKernel's fork): accepted; the architecture comes from `compute_capability` or the
    lowering's device, as in jax-triton.
    """
    del cost_estimate, device
    if custom_call_target_name not in (None, compat.LEGACY_TARGET, compat.FFI_TARGET):
        raise ValueError(f"custom_call_target_name={custom_call_target_name!r}: kernel-cache emits "
                         f"'{compat.LEGACY_TARGET}' or '{compat.FFI_TARGET}'")
    launch = {"num_warps": num_warps, "num_stages": num_stages, "num_ctas": num_ctas}
    options = dict(backend_options or {})
    for key in _LAUNCH_KEYS:
        if key in options:
            if launch[key] not in (None, 1 if key == "num_ctas" else None):
                raise ValueError(f"{key} given both as an argument and in backend_options")
            launch[key] = options.pop(key)
    if launch["num_ctas"] is None:
        launch["num_ctas"] = 1
    if out_shape is None and out_type is None:
        raise TypeError("triton_call needs out_shape (or out_type): the shapes and dtypes of the outputs")
    if out_shape is not None and out_type is not None:
        raise TypeError("pass either out_shape or out_type, not both")
    shapes = out_shape if out_shape is not None else out_type
    shapes = tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), shapes)
    flat_out, out_tree = tree_util.tree_flatten(shapes)
    if not flat_out:
        raise ValueError("triton_call needs at least one output")

    _refuse_unsupported(args)
    flat_args, _ = tree_util.tree_flatten(args)
    array_keywords = {k: v for k, v in metaparams.items() if not _is_scalar(v) and hasattr(v, "shape")}
    if array_keywords:  # jax-triton 0.4: a keyword naming a runtime parameter is an operand
        flat_args = _with_keyword_operands(kernel, flat_args, array_keywords, metaparams)
        metaparams = {k: v for k, v in metaparams.items() if k not in array_keywords}
    arrays, scalars = [], []
    for position, arg in enumerate(flat_args):
        if _is_scalar(arg):
            scalars.append((position, _scalar(arg)))
        else:
            arrays.append(arg)
    devices.check_arrays(arrays)
    aliases = tuple(sorted((int(i), int(o)) for i, o in (input_output_aliases or {}).items()))
    for i, o in aliases:
        if not (0 <= i < len(arrays) and 0 <= o < len(flat_out)):
            raise ValueError(f"input_output_aliases entry {i}: {o} is out of range "
                             f"({len(arrays)} array inputs, {len(flat_out)} outputs)")
    if len({o for _, o in aliases}) != len(aliases):
        raise ValueError(f"input_output_aliases must map each output from at most one input, got "
                         f"{dict(aliases)}")
    out_flat = triton_kernel_call_p.bind(
        *arrays, kernel=kernel, scalars=tuple(scalars),
        out_avals=tuple((tuple(s.shape), np.dtype(s.dtype)) for s in flat_out), grid=grid_param(grid),
        name=name, **launch, compute_capability=compute_capability, enable_fp_fusion=enable_fp_fusion,
        backend_options=_hashable_items(options, "backend_options"), input_output_aliases=aliases,
        zeroed_outputs=zeroed_param(zeroed_outputs), debug=debug,
        serialized_metadata=bytes(serialized_metadata), metaparams=_hashable_items(metaparams, "metaparameter"),
        has_side_effect=bool(has_side_effect), custom_call_target=custom_call_target_name or "")
    return tree_util.tree_unflatten(out_tree, out_flat)
