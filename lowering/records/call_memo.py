"""The same call lowered again in this session: its plan and payload without planning or a key.

Within one jit JAX lowers identical calls once; across jits it does not: a training and an
evaluation step, a function jitted anew (a new closure, a `partial`), a re-trace for new shapes of
other arguments each run the rule again for calls it has seen. Once a call has been served from its
record, its plan and payload are kept under an exact key of what the rule is given: the platform,
the operands' and results' avals, every primitive parameter and the module's Triton environment and
jaxlib capabilities (`call_key.module_text`). Exact means type-exact: the int 1, the float 1.0, True
and numpy's 1.0 are different keys, as they are different kernels; -0.0 and 0.0 differ too. An
object without a value form (the kernel, a grid function) is keyed by identity and held by the key,
so its id is never reused meanwhile; an Autotuner's configs (a list the user may edit) are keyed by
their values. Like JAX's own caches, it trusts that a function given as a parameter (a grid, a
heuristic) answers the same for the same arguments. A grid written as a lambda over the operands is
a new closure at every trace: such a call is not memoized (`_lasting`), since holding the closure
would keep its tracers alive for nothing.

Session-scoped: `configure()` and `Session.forget()` drop it with every other memo, and tuning
(`winners.TUNING`) bypasses it (nothing lowered may be reused). A hit counts as one record hit
from memory, as serving the record from the memory level would.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from types import FunctionType
from typing import Any, NamedTuple, cast

import numpy as np
from jax import core, tree_util

from compiler import triton_compat as tc
from kernel_cache import Session, lookup_log
from kernel_cache.value_class import FrozenValue

from ..frontend.frozen_items import FrozenItems
from ..planning.aliasing import CallShape
from ..planning.plan import KernelPlan
from . import call_key, call_records

MAX_ENTRIES = 4096  # calls kept per session; later calls are lowered as before
MAX_PAYLOAD_BYTES = 64 << 20  # payload bytes kept per session
_MEMO = "lowering.records.call_memo"  # this module's session memo (`_Memo`)


class Known(NamedTuple):
    """A call served before: what the rule emits, and what serving it counts."""

    plan: KernelPlan | CallShape  # (a call served by its signature: what emitting it reads)
    payload: bytes
    kernels: int
    record_key: str
    compile_seconds: float


class _Memo:
    def __init__(self) -> None:
        self.seen: set[tuple[Any, ...]] = set()  # rough keys of the calls lowered once
        self.calls: dict[tuple[Any, ...], Known] = {}
        self.payload_bytes = 0


def lookup(session: Session, platform: str, avals_in: Sequence[Any], avals_out: Sequence[Any],
           params: Mapping[str, Any], module: Any) -> tuple[Known | None, tuple[Any, ...] | None]:
    """(what this session served for this exact call, or None; the call's exact key to `put` it
    under, or None). A call is keyed exactly only from its second lowering on: the first is noted
    by a rough key (kernel, avals, metaparameters, scalars: ~1 us, equal across 1 and 1.0), so a
    process that lowers each call once pays nothing for the memo."""
    memo = session.memos.get(_MEMO) or session.memo(_MEMO, _Memo)
    try:
        rough = (id(params.get("kernel")), *avals_in, params.get("metaparams"), params.get("scalars"))
        if rough not in memo.seen:
            if len(memo.seen) < MAX_ENTRIES:
                memo.seen.add(rough)
            return None, None
    except TypeError:  # an unhashable value: not memoized
        return None, None
    exact = key_of(platform, avals_in, avals_out, params, call_key.module_text(module, platform, session.config))
    if exact is None:
        return None, None
    found = memo.calls.get(exact)
    return found, exact if found is None else None


def key_of(platform: str, avals_in: Sequence[Any], avals_out: Sequence[Any], params: Mapping[str, Any],
           module_text: str) -> tuple[Any, ...] | None:
    """The exact key of this call, or None where it cannot be keyed exactly (an aval or a value of a
    kind not known here). It holds the objects it keys by identity, so their ids are not reused."""
    by_identity: list[Any] = []
    try:
        key = (platform, module_text, _avals(avals_in), _avals(avals_out),
               tuple((name, _exact(value, by_identity)) for name, value in params.items()),
               _tuner_state(params.get("kernel"), by_identity), tuple(by_identity))
    except _NotExact:
        return None
    return key


def put(session: Session, key: tuple[Any, ...], known: Known) -> None:
    memo = session.memos.get(_MEMO) or session.memo(_MEMO, _Memo)
    size = len(known.payload)
    if len(memo.calls) < MAX_ENTRIES and memo.payload_bytes + size <= MAX_PAYLOAD_BYTES and key not in memo.calls:
        memo.calls[key] = known
        memo.payload_bytes += size


def count_hit(session: Session, known: Known) -> None:
    """One record hit from memory (its kernels are not read), logged as the record store logs one."""
    start = time.perf_counter()
    session.store.stats.record_hit("memory", known.record_key, known.compile_seconds)
    if lookup_log.log.isEnabledFor(logging.INFO):
        kernel, count = known.plan.fn.__name__, known.kernels
        lookup_log.lookup(known.record_key, lambda: call_records.record_label(kernel, count), "memory", start)


class _NotExact(Exception):
    pass


def _avals(avals: Sequence[Any]) -> tuple[Any, ...]:
    for aval in avals:
        if type(aval) is not core.ShapedArray:  # its equality: shape, dtype, weak type, sharding, memory space
            raise _NotExact
    return tuple(avals)


def _float(value: float) -> Any:
    return (float, value.hex()) if math.isfinite(value) else (float, repr(value))


def _tagged(value: Any) -> Any:
    return (type(value), value)


# type -> its exact form: scalars tagged with their type (1, 1.0, True and np.float32(1) are equal in
# Python), strings, bytes and None as themselves (equal only to their own kind)
_LEAVES: dict[type, Any] = {int: _tagged, bool: _tagged, float: _float, str: lambda v: v, bytes: lambda v: v,
                            type(None): lambda v: v}


_TREE = type(tree_util.tree_structure(()))


def _exact(value: Any, by_identity: list[Any]) -> Any:
    kind = type(value)
    leaf = _LEAVES.get(kind)
    if leaf is not None:
        return leaf(value)
    if kind is tuple or kind is list:
        return (kind, tuple([_exact(item, by_identity) for item in value]))
    if kind is dict:
        return (dict, tuple([(_exact(k, by_identity), _exact(v, by_identity)) for k, v in value.items()]))
    if kind is FrozenItems:  # a mapping parameter (metaparams...): by its items, in order
        return (kind, tuple([(_exact(k, by_identity), _exact(v, by_identity)) for k, v in value.items()]))
    if isinstance(value, np.generic):
        return (kind, value.tobytes())
    if isinstance(value, np.dtype):
        return (np.dtype, value.str, value.name)
    if isinstance(value, type):  # a dtype given as its scalar type (jnp.float32), a class
        by_identity.append(value)
        return ("id", id(value))
    if cast(Any, kind).__eq__ is object.__eq__ and _lasting(value):  # the kernel, a module-level grid function
        by_identity.append(value)
        return ("id", id(value))
    if isinstance(value, FrozenValue):  # a typed scalar, a descriptor: equal by their fields' values
        return (kind, tuple([_exact(field, by_identity) for field in value._values(value)]))
    value_form = getattr(kind, "__dataclass_fields__", None)
    if value_form is not None and cast(Any, kind).__dataclass_params__.frozen:  # a frozen dataclass, likewise
        return (kind, tuple([_exact(getattr(value, name), by_identity) for name in value_form]))
    if kind is _TREE:  # Triton tuple parameters' structure: equal only to the same structure
        return (kind, value)
    raise _NotExact


def _lasting(value: Any) -> bool:
    """Whether an object keyed by identity may be held by the memo: a Triton kernel (under its
    wrappers) or a function that closes over nothing. A closure (a grid lambda over the operands,
    made anew at every trace) would never be asked for again, and would keep what it closes over
    (tracers, their trace) alive: such calls are not memoized."""
    if isinstance(value, FunctionType):
        return not value.__closure__
    return tc.is_jit_function(value) or tc.is_autotuner(value) or tc.is_heuristics(value)


def _tuner_state(kernel: Any, by_identity: list[Any]) -> Any:
    """The values of an Autotuner's configs (the user may edit its list between calls); () for a kernel
    under no Autotuner."""
    return tuple([tuple([_exact(_fields(config), by_identity) for config in tc.autotune_configs(wrapper)])
                  for wrapper in tc.wrapper_chain(kernel) if tc.is_autotuner(wrapper)])


def _fields(config: Any) -> dict[str, Any]:
    fields = getattr(config, "__dict__", None)
    if type(fields) is not dict:
        raise _NotExact
    return fields
