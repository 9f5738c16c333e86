"""Every difference between JAX releases, and every private JAX module, that the primitive and
`triton_call` touch, in one place, decided by capability (jaxlib's differences are in
`lowering.payload.jaxlib_compat`): JAX 0.12 passes a DCE rule the inputs' liveness and a discharge
rule a `DischargeContext`, earlier releases neither.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax._src.state import discharge as _state_discharge
from jax._src.state.types import AbstractRef, ReadEffect, TransformedRef, WriteEffect
from jax.interpreters import partial_eval as pe

# (used outputs per output, the equation) -> (used inputs per input, the equation or None)
DceRule = Callable[[list[bool], Any], "tuple[list[bool], Any]"]
# (in avals, out avals, operands, params) -> (new values for the inputs (None: unchanged), outputs)
DischargeImpl = Callable[[Sequence[Any], Sequence[Any], Sequence[Any], dict[str, Any]], "tuple[list[Any], list[Any]]"]


def register_dce_rule(primitive: Any, rule: DceRule) -> None:
    """`rule` as the primitive's DCE rule, whatever this JAX passes before the equation."""

    def adapted(used_outputs: list[bool], *rest: Any) -> Any:
        return rule(used_outputs, rest[-1])

    adapted._kernel_cache_dce_rule = rule  # type: ignore[attr-defined]
    pe.dce_rules[primitive] = adapted


def adapt_foreign_dce_rule(primitive: Any) -> None:
    """Another library's DCE rule written for the two arguments of earlier JAX (jax-triton 0.4.1's
    fails at trace time on JAX 0.12: `takes 2 positional arguments but 3 were given`), registered
    again to take whatever this JAX passes; a rule of other arity, or one already adapted, is left."""
    theirs: Callable[..., Any] | None = pe.dce_rules.get(primitive)
    if theirs is None or hasattr(theirs, "_kernel_cache_dce_rule"):
        return
    try:
        takes = len(inspect.signature(theirs).parameters)
    except (TypeError, ValueError):
        return
    if takes == 2:
        register_dce_rule(primitive, theirs)


def register_discharge_rule(primitive: Any, impl: DischargeImpl) -> None:
    if hasattr(_state_discharge, "DischargeContext"):
        def rule(ctx: Any, /, *operands: Any, **params: Any) -> Any:
            return impl(ctx.in_avals, ctx.out_avals, operands, params)
    else:
        def rule(in_avals: Any, out_avals: Any, /, *operands: Any, **params: Any) -> Any:  # type: ignore[misc]
            return impl(in_avals, out_avals, operands, params)
    _state_discharge.register_discharge_rule(primitive)(rule)


def is_ref_aval(aval: Any) -> bool:
    return isinstance(aval, AbstractRef)


def is_ref(value: Any) -> bool:
    """Whether `value` is a jax.Ref (a scalar never is: jax.typeof of an int beyond int32 raises on
    some JAX versions)."""
    if isinstance(value, (bool, int, float, complex, np.generic)):
        return False
    try:
        return isinstance(jax.typeof(value), AbstractRef)
    except Exception:  # not a JAX value at all: whatever it is, it is not a Ref
        return False


def ref_effects(avals_in: Sequence[Any]) -> set[Any]:
    """A read and a write effect per Ref operand: a kernel may do either, and JAX cannot tell which."""
    return {effect(i) for i, aval in enumerate(avals_in) if is_ref_aval(aval) for effect in (ReadEffect, WriteEffect)}


def is_transformed_ref(value: Any) -> bool:
    """A view of a Ref (ref.at[...], a bitcast): kernel-cache passes whole buffers only."""
    return isinstance(value, TransformedRef)


def redecide_persistent_cache() -> None:
    """JAX decides once per process, at its first compile, whether its persistent cache is used; a
    directory set after that is ignored until the decision is reset (`compilation_cache.reset_cache`,
    in every supported JAX)."""
    from jax._src import compilation_cache

    compilation_cache.reset_cache()


def backends_started() -> bool:
    """Whether JAX has started its backends (asking never starts one: from a background thread a
    backend's start can be cut short by the interpreter's exit, which aborts the process; and on a
    GPU host it takes seconds)."""
    from jax._src import xla_bridge

    return bool(xla_bridge.backends_are_initialized())


class JobStore:
    """`jax.distributed`'s key-value client as `kernel_cache.levels.job.JobClient`."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def get(self, name: str) -> bytes | None:
        try:
            return bytes(self._client.key_value_try_get_bytes(name))
        except Exception as exc:
            if _status(exc) == "NOT_FOUND":
                return None
            raise

    def create(self, name: str, value: bytes) -> bool:
        try:
            self._client.key_value_set_bytes(name, value, allow_overwrite=False)
        except Exception as exc:
            if _status(exc) == "ALREADY_EXISTS":
                return False
            raise
        return True

    def overwrite(self, name: str, value: bytes) -> None:
        self._client.key_value_set_bytes(name, value, allow_overwrite=True)

    def delete(self, name: str) -> None:
        self._client.key_value_delete(name)


def job_store() -> tuple[JobStore, int, int] | None:
    """(the job's key-value store, this process's id, the number of processes) where `jax.distributed`
    is initialized with several processes and its client has the byte calls; None otherwise (asking
    starts nothing)."""
    from jax._src import distributed

    state = distributed.global_state
    client, processes = state.client, state.num_processes
    if client is None or not isinstance(processes, int) or processes < 2:
        return None
    if not all(hasattr(client, call) for call in ("key_value_try_get_bytes", "key_value_set_bytes", "key_value_delete")):
        return None
    return JobStore(client), int(state.process_id), processes


def _status(exc: Exception) -> str:
    """The status a coordination-service error names first ('NOT_FOUND: Config key ... not found')."""
    return str(exc).split(":", 1)[0].strip()
