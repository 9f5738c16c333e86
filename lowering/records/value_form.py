"""The value form of a call's inputs: what its signature (`call_key.signed_call`) hashes.

Each input becomes plain values and string-tagged tuples, hashed as marshal writes them (version 0
writes no back-references, so equal values give equal bytes whatever their identity). An int, a bool,
None, a str and bytes are themselves (marshal tells their types apart); everything else is a tuple
tagged by a string, so a user's tuple never reads as a tagged value and the int 1, the float 1.0,
True and "1" differ. Anything known by identity alone (a function, an object without a value) has no
form: a TypeError, as the key's encoder raises for what it cannot key.
"""

from __future__ import annotations

import marshal
import math
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np
from jax import core

from compiler import triton_compat as tc
from kernel_cache.value_class import FrozenValue

from ..planning.bound_call import FrozenItems
from ..planning.plan import Evaluation, dtype_info


def call_form(avals_in: Sequence[Any], avals_out: Sequence[Any], fn: Any, wrappers: Sequence[Any], device: str | None,
              params: Mapping[str, Any], evaluation: Evaluation) -> bytes:
    """The bytes a call's own inputs are hashed as: its avals, its kernel (`kernel_form`) and its other
    parameters, those given as functions by what they evaluated to (tagged "E": never a value's form;
    asked only once the kernel has a form). TypeError where one has no form, or a function raised."""
    kernel = kernel_form(fn, wrappers, device)
    evaluated = _evaluated(params, evaluation)
    values = [*avals_in, *avals_out]
    for aval in values:
        if type(aval) is not core.ShapedArray:
            raise TypeError(f"no value form for an aval of {type(aval).__name__}")
    shapes = tuple([(tuple(map(int, a.shape)), dtype_info(a.dtype)[0], bool(a.weak_type)) for a in values])
    return marshal.dumps((shapes, len(avals_in), kernel,
                          tuple([(name, form(value) if name not in evaluated else ("E", form(evaluated[name])))
                                 for name, value in params.items() if name != "kernel"])), 0)


def _evaluated(params: Mapping[str, Any], evaluation: Evaluation) -> dict[str, Any]:
    """{parameter: its values per config} for a grid and zeroed outputs written as functions (all the
    plan keeps of them). TypeError where a function raised (the call's plan reports the error)."""
    grid, zeroed = params.get("grid"), params.get("zeroed_outputs")
    if not (callable(grid) or callable(zeroed)):
        return {}
    try:
        resolved = evaluation.resolved()[4]
    except Exception as error:  # the user's function, or parameters planning refuses: its plan says which
        raise TypeError("a function of the call raised: its plan reports it") from error
    return {name: values for name, value, values in (("grid", grid, resolved.grids),
                                                     ("zeroed_outputs", zeroed, resolved.zeroed)) if callable(value)}


def kernel_form(fn: Any, wrappers: Sequence[Any], device: str | None) -> Any:
    """What a plan reads of a kernel besides its fingerprint: its constexpr defaults (a global can set
    them), each Autotuner by its keys and configs' every field, and the GPU model of its winners.
    TypeError for a Heuristics wrapper, a prune hook or perf model, or a pre_hook."""
    tuners = []
    for wrapper in wrappers:
        hooks = tc.prune_hooks(wrapper) if tc.is_autotuner(wrapper) else None
        if hooks is None or hooks.early_config_prune is not None or hooks.perf_model is not None:
            raise TypeError("no value form for a Heuristics wrapper or an Autotuner's prune hooks")
        tuners.append((tuple(tc.autotune_keys(wrapper)),
                       tuple([form(vars(config)) for config in tc.autotune_configs(wrapper)])))
    return form(tc.constexpr_defaults(fn)), tuple(tuners), device


_PLAIN = frozenset({int, bool, type(None), str, bytes})


def form(value: Any) -> Any:
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is tuple:
        return ("T", tuple([form(item) for item in value]))
    if kind is list:
        return ("L", tuple([form(item) for item in value]))
    if kind is dict:
        return ("D", tuple([(form(k), form(v)) for k, v in value.items()]))
    if kind is FrozenItems:  # a mapping parameter (metaparams...): by its items, in order
        return ("M", tuple([(form(k), form(v)) for k, v in value.items()]))
    if kind is float:
        return ("F", value.hex() if math.isfinite(value) else repr(value))
    if isinstance(value, np.generic):
        return ("N", kind.__module__, kind.__qualname__, value.tobytes())
    if isinstance(value, np.dtype):
        return ("ND", value.str, dtype_info(value)[0])
    if isinstance(value, type):  # a dtype given as its scalar type (jnp.float32): by its qualified name
        return ("C", value.__module__, value.__qualname__)
    if isinstance(value, FrozenValue):  # a typed scalar, a descriptor: by their fields' values
        return ("V", kind.__module__, kind.__qualname__, tuple([form(field) for field in value._values(value)]))
    if tc.is_jit_function(value):  # a @jit function passed as a constexpr: as the key has it
        return ("J", tc.kernel_fingerprint(value))
    if kind.__name__ == "dtype" and hasattr(value, "name"):  # triton.language's
        return ("TD", str(value))
    if kind.__name__ == "constexpr" and hasattr(value, "value"):
        return ("TC", form(cast(Any, value).value))
    raise TypeError(f"no value form for {kind.__name__}")
