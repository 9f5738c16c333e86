"""`triton_call`: launch a Triton kernel from JAX, with jax-triton's signature (0.3's and 0.4's
keywords: out_shape/out_type, backend_options, has_side_effect, cost_estimate).

Arrays are passed in order, then one pointer per output; Python/NumPy scalars become scalar kernel
arguments fixed at trace time. A keyword naming a runtime parameter is that parameter's operand
(jax-triton 0.4, `_bind_keywords`); other keywords are constexprs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax import tree_util

from kernel_cache.sanitize import echo

from .. import jax_compat, tensor_descriptor
from ..compile_ahead import ahead
from ..payload import jaxlib_compat as compat
from ..planning import aliasing
from ..planning.bound_call import FrozenItems
from ..planning.configs import kernel_name, runtime_param_names
from ..tensor_descriptor import TensorDescriptor
from . import rule
from .primitive import triton_kernel_call_p

LAUNCH_KEYS = ("num_warps", "num_stages", "num_ctas")  # Triton launch options, also allowed in backend_options


def _is_scalar(value: Any) -> bool:
    if isinstance(value, (np.complexfloating, np.str_, np.bytes_, np.void)):
        raise TypeError(f"a {type(value).__name__} scalar cannot be passed to a Triton kernel")
    return isinstance(value, (bool, int, float, np.generic))


def _hashable_items(mapping: Mapping[str, Any] | None, what: str) -> FrozenItems:
    """The mapping's items sorted, each value hashable: they are part of the traced call."""
    items = tuple(sorted((mapping or {}).items()))
    for key, value in items:
        try:
            hash(value)
        except TypeError:
            raise TypeError(f"{what}[{key!r}] must be hashable, got {echo(value)}") from None
    return FrozenItems(items)


def cost_estimate_param(estimate: Mapping[str, Any] | None) -> FrozenItems | None:
    """jax-triton 0.4's cost_estimate, checked and made hashable; XLA's scheduler reads it from the custom call."""
    if not estimate:
        return None
    known = ("flops", "bytes_accessed", "transcendentals")
    unknown = sorted(set(estimate) - set(known))
    if unknown:
        raise ValueError(f"cost_estimate keys {unknown} are not known; expected some of {', '.join(known)}")
    items = []
    for key in known:
        if key in estimate:
            value = estimate[key]
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or value < 0:
                raise ValueError(f"cost_estimate[{key!r}] must be a number >= 0, got {value!r}")
            items.append((key, int(value) if float(value).is_integer() else float(value)))
    return FrozenItems(items)


def grid_param(grid: Any) -> Any:
    if callable(grid):
        return grid
    if isinstance(grid, (list, tuple)):
        return tuple(int(g) for g in grid)
    return int(grid)


def zeroed_param(zeroed: Any) -> Any:
    return zeroed if callable(zeroed) else tuple(int(i) for i in zeroed)


def _refuse_unsupported(args: tuple[Any, ...], keywords: Mapping[str, Any]) -> None:
    """TensorDescriptor arguments and views of Refs fail here, each with what it needs."""
    leaves = tree_util.tree_leaves((args, dict(keywords)),
                                   is_leaf=lambda a: isinstance(a, TensorDescriptor) or jax_compat.is_transformed_ref(a))
    for position, leaf in enumerate(leaves):
        if isinstance(leaf, TensorDescriptor) and not tensor_descriptor.supported():
            tensor_descriptor.refuse(position)
        if jax_compat.is_transformed_ref(leaf):
            raise NotImplementedError("TransformedRefs are not supported as triton_call arguments")


def _tuple_parameters(name: str, param_names: Sequence[str], top: list[Any], tree: Any, num_flat: int, num_out: int,
                      aliases: Sequence[tuple[int, int]]) -> Any:
    """The arguments' tree when tuples among them are Triton tuple parameters (jax-triton 0.4: the
    kernel's parameter count fits one parameter per tuple) or they hold TensorDescriptors, else None
    (every leaf its own parameter, as jax-triton 0.3 flattened them)."""
    if any(isinstance(a, TensorDescriptor) for a in top):
        return tree  # a descriptor is one parameter whatever the count: its tree keeps its fields
    if not any(isinstance(a, tuple) for a in top):
        return None
    if any(isinstance(leaf, list) for a in top if isinstance(a, tuple)
           for leaf in tree_util.tree_leaves(a, is_leaf=lambda x: isinstance(x, list))):
        return None  # lists are no Triton tuples: flattened as before
    counts = [len(top) + num_out - k for k in (0, len(aliases))]
    if len(param_names) in counts:
        return tree
    if len(param_names) in [num_flat + num_out - k for k in (0, len(aliases))]:
        return None
    raise TypeError(f"kernel '{name}' takes {len(param_names)} runtime arguments ({', '.join(param_names)}); "
                    f"its {len(top)} arguments hold tuples: as Triton tuple parameters (jax-triton 0.4) they "
                    f"fill {counts[0]} with the outputs, flattened (jax-triton 0.3) {num_flat + num_out}")


def _bind_keywords(kernel: Any, top: list[Any], metaparams: Mapping[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """(the arguments with the keyword operands placed at their parameters, the metaparameters left):
    jax-triton 0.4's binding, with 0.3's constant kept for a scalar keyword 0.4's cannot bind (the
    same results either way; docs/clients.md, "Keywords")."""
    declared = runtime_param_names(kernel, {})
    candidates = {k: v for k, v in metaparams.items() if k in declared and (_is_scalar(v) or hasattr(v, "shape"))}
    arrays = [k for k, v in metaparams.items() if not _is_scalar(v) and hasattr(v, "shape")]
    strays = [k for k in arrays if k not in candidates]
    if strays:
        raise TypeError(f"keyword {', '.join(repr(k) for k in strays)} is an array but names no runtime parameter "
                        f"of the kernel ({', '.join(declared)}): pass arrays positionally or by a parameter's name")
    compiled_in: set[str] = set()  # scalar keywords read as 0.3 reads them
    while True:
        operands = {k: v for k, v in candidates.items() if k not in compiled_in}
        names = runtime_param_names(kernel, {k: v for k, v in metaparams.items() if k not in operands})
        filled, rest = names[:len(top)], names[len(top):]
        inputs = len(filled) + next((i for i, n in enumerate(rest) if n not in operands), len(rest))
        repeated = [k for k in operands if k in filled]
        late = [k for k in operands if k in names[inputs:]]
        scalars = [k for k in repeated + late if _is_scalar(operands[k])]
        if not scalars:
            break
        compiled_in.update(scalars)
    name = kernel_name(kernel)
    if repeated:
        raise TypeError(f"kernel '{name}' got multiple values for argument {', '.join(repr(k) for k in repeated)}: "
                        f"the {len(top)} positional arguments fill its runtime parameters {', '.join(filled)}")
    if late:
        raise TypeError(f"keyword array {', '.join(repr(k) for k in late)} names a parameter after the ones the "
                        f"outputs take ({', '.join(n for n in names[inputs:] if n not in operands)}): kernel-cache "
                        f"launches a kernel's inputs first and its outputs last; pass it positionally or reorder "
                        f"the kernel's parameters")
    if not operands:
        return top, dict(metaparams)
    positional = iter(top)
    bound = [operands[n] if n in operands else next(positional) for n in names[:inputs]]
    return bound, {k: v for k, v in metaparams.items() if k not in operands}


def _launch_options(num_warps: int | None, num_stages: int | None, num_ctas: int | None,
                    backend_options: Mapping[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(launch parameters, the other Triton options): jax-triton 0.4 may pass them in backend_options."""
    launch: dict[str, Any] = {"num_warps": num_warps, "num_stages": num_stages, "num_ctas": num_ctas}
    options = dict(backend_options or {})
    for key in LAUNCH_KEYS:
        if key in options:
            if launch[key] not in (None, 1 if key == "num_ctas" else None):
                raise ValueError(f"{key} given both as an argument and in backend_options")
            launch[key] = options.pop(key)
    if launch["num_ctas"] is None:
        launch["num_ctas"] = 1
    return launch, options


def triton_call(*args: Any, kernel: Any, out_shape: Any = None, out_type: Any = None, grid: Any,
                name: str = "", num_warps: int | None = None, num_stages: int | None = None,
                num_ctas: int | None = 1, compute_capability: "int | str | None" = None,
                enable_fp_fusion: bool = True, backend_options: Mapping[str, Any] | None = None,
                input_output_aliases: Mapping[int, int] | None = None,
                zeroed_outputs: "Sequence[int] | Callable[[dict[str, Any]], Sequence[int]]" = (),
                debug: bool = False, serialized_metadata: bytes = b"", has_side_effect: bool = False,
                cost_estimate: Any = None, custom_call_target_name: str | None = None, device: int = 0,
                **metaparams: Any) -> Any:
    """Call `kernel` (a @triton.jit function, possibly wrapped by triton.autotune / triton.heuristics).

    out_shape / out_type: a ShapeDtypeStruct or any pytree of objects with .shape and .dtype; the
    result has the same structure. grid: int, tuple of up to 3 ints, or a callable of the
    metaparameters (evaluated per autotune config). input_output_aliases: {input index: output
    index}, counted over array arguments; whether the kernel takes a pointer for an aliased output
    (jax-triton 0.3) or writes into the input's buffer (0.4) is read from its parameter count
    (lowering.planning.aliasing). zeroed_outputs: output indices to zero before launch (or a
    callable of the metaparameters). compute_capability: e.g. 90 (default: the device's).
    backend_options: Triton options; num_warps/num_stages/num_ctas may be given there instead (as in
    jax-triton 0.4). has_side_effect: keep the call even when its outputs are unused.
    cost_estimate (jax-triton 0.4): {"flops", "bytes_accessed", "transcendentals"} for XLA's scheduler,
    carried on the custom call as `cost_estimate_json`.
    custom_call_target_name (jax-triton 0.3): None picks the CUDA-graph-compatible FFI target where
    the plugin registers it (the legacy one for autotuned calls); "triton_kernel_call" forces the
    legacy target; "triton_kernel_call_ffi" requires the FFI one.
    device (ejKernel's fork): accepted; the architecture comes from `compute_capability` or the
    lowering's device, as in jax-triton.
    """
    del device
    if custom_call_target_name not in (None, compat.LEGACY_TARGET, compat.FFI_TARGET):
        raise ValueError(f"custom_call_target_name={custom_call_target_name!r}: kernel-cache emits "
                         f"'{compat.LEGACY_TARGET}' or '{compat.FFI_TARGET}'")
    launch, options = _launch_options(num_warps, num_stages, num_ctas, backend_options)
    if (out_shape is None) == (out_type is None):
        raise TypeError("triton_call needs out_shape (or out_type): the shapes and dtypes of the outputs"
                        if out_shape is None else "pass either out_shape or out_type, not both")
    shapes = tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype),  # type: ignore[no-untyped-call]  # jax's
                                out_shape if out_shape is not None else out_type)
    flat_out, out_tree = tree_util.tree_flatten(shapes)

    _refuse_unsupported(args, metaparams)
    top = list(args)  # one entry per kernel parameter (a tuple: a Triton tuple parameter, jax-triton 0.4)
    flat_args = tree_util.tree_leaves(top)
    refs = any(jax_compat.is_ref(a) for a in [*flat_args, *metaparams.values()])
    if not flat_out and not refs:
        raise ValueError("triton_call needs at least one output (out_shape/out_type) or a jax.Ref argument "
                         "written in place")
    if refs and input_output_aliases:
        raise ValueError("input_output_aliases cannot be combined with Ref arguments. Refs express input/output "
                         "aliasing implicitly")
    top, metaparams = _bind_keywords(kernel, top, metaparams)  # jax-triton 0.4: keyword operands
    flat_args, tree = tree_util.tree_flatten(top)
    arrays, scalars = [], []
    for position, arg in enumerate(flat_args):
        if _is_scalar(arg):
            scalars.append((position, arg.item() if isinstance(arg, np.generic) else arg))
        else:
            arrays.append(arg)
    rule.check_arrays(arrays)
    aliases = tuple(sorted((int(i), int(o)) for i, o in (input_output_aliases or {}).items()))
    if len({o for _, o in aliases}) != len(aliases):
        raise ValueError(f"input_output_aliases must map each output from at most one input, got "
                         f"{dict(aliases)}")
    param_names = runtime_param_names(kernel, metaparams)
    arg_tree = _tuple_parameters(kernel_name(kernel), param_names, top, tree, len(flat_args), len(flat_out), aliases)
    pointerless = aliasing.pointerless_aliases(kernel_name(kernel), param_names,
                                               len(top) if arg_tree is not None else len(flat_args),
                                               len(flat_out), aliases)
    if pointerless:  # jax-triton 0.4 counts its aliases' inputs over all operands, scalars included
        aliases = aliasing.array_indices(aliases, [p for p, _ in scalars], len(flat_args))
    for i, o in aliases:
        if not (0 <= i < len(arrays) and 0 <= o < len(flat_out)):
            raise ValueError(f"input_output_aliases entry {i}: {o} is out of range "
                             f"({len(arrays)} array inputs, {len(flat_out)} outputs)")
    params = dict(
        kernel=kernel, scalars=tuple(scalars),
        out_avals=tuple((tuple(s.shape), np.dtype(s.dtype)) for s in flat_out), grid=grid_param(grid),
        name=name, **launch, compute_capability=compute_capability, enable_fp_fusion=enable_fp_fusion,
        backend_options=_hashable_items(options, "backend_options"), input_output_aliases=FrozenItems(aliases),
        zeroed_outputs=zeroed_param(zeroed_outputs), debug=debug,
        serialized_metadata=bytes(serialized_metadata), metaparams=_hashable_items(metaparams, "metaparameters"),
        has_side_effect=bool(has_side_effect), custom_call_target=custom_call_target_name or "",
        pointerless_aliases=pointerless, cost_estimate=cost_estimate_param(cost_estimate), arg_tree=arg_tree)
    if not refs:  # a Ref call is lowered in its discharged form: planned by its rule alone
        ahead.note(arrays, params)
    out_flat = triton_kernel_call_p.bind(*arrays, **params)  # type: ignore[no-untyped-call]  # unannotated in jax
    return tree_util.tree_unflatten(out_tree, out_flat)
