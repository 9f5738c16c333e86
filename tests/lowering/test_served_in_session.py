"""The same call lowered again in a session (another jit, a re-trace): the serving path's first tier
serves it by its signature, with the same custom call, without planning, keying or reading the
store, from its third lowering on (the second is served by its key and remembered); each time one
record hit. Nothing of the call is held but its record (a grid closure and the tracers it holds go
with the trace); records off, the session still serves it; dropped with the session's memos."""

from __future__ import annotations

import gc

import jax
import jax.numpy as jnp
import pytest
from test_call_records import PROGRAMS, forget, lower, use_store  # noqa: F401  (fixture)

import kernel_cache
import lowering as jt
from compiler import examples as kernels
from kernel_cache.entries.call_entry import CallRecord
from lowering.planning import plan
from lowering.records import call_records

VEC = jax.ShapeDtypeStruct((4096,), jnp.float32)


@pytest.fixture
def planned(monkeypatch) -> list[int]:
    """One item per call planned."""
    seen: list[int] = []
    real_of = plan.KernelPlan.of.__func__
    monkeypatch.setattr(plan.KernelPlan, "of", classmethod(lambda cls, *a: seen.append(1) or real_of(cls, *a)))
    return seen


def _record_hits(store) -> int:
    return sum(store.stats.session()["record_hits"].values())


@pytest.mark.parametrize("program", [0, 1], ids=["a plain grid", "a grid closure over the operands"])
def test_the_third_lowering_is_served_by_the_session(tmp_path, use_store, planned, program):  # noqa: F811
    store = use_store(tmp_path / "session")
    _, fn, shapes = PROGRAMS[program]
    first = lower(fn, shapes)  # kernel by kernel: compiled and recorded
    assert lower(fn, shapes) == first and len(planned) == 2  # served from its record by its key, remembered
    hits = _record_hits(store)
    for _ in range(3):
        assert lower(fn, shapes) == first
    assert len(planned) == 2  # neither planned nor keyed again
    assert _record_hits(store) == hits + 3  # each counted as one record hit
    forget()  # dropped with the session's memos
    assert lower(fn, shapes) == first and len(planned) == 3


def test_nothing_of_the_call_is_held(tmp_path, use_store):  # noqa: F811
    """A grid closure is made anew at every trace: the session keeps the record it served (plain
    values), never the call, its closure or the tracers the closure holds."""
    use_store(tmp_path / "held")

    def program(x, y):
        return jt.triton_call(x, y, x.size, kernel=kernels.add_kernel, out_shape=x,
                              grid=lambda meta: (x.size // meta["BLOCK"],), BLOCK=1024, compute_capability=90)

    for _ in range(3):
        lower(program, (VEC, VEC))
    memos = call_records._MEMOS.of(kernel_cache.current_session())
    held = list(memos.served.values())
    assert held and all(type(record) is CallRecord for record in held)
    reached, pending = set(), list(held)
    while pending:  # everything the kept records reach: plain values only
        value = pending.pop()
        if id(value) in reached or isinstance(value, type):  # a class is no part of the call
            continue
        reached.add(id(value))
        assert not callable(value) and not isinstance(value, jax.core.Tracer), value
        pending.extend(gc.get_referents(value))


def test_int_and_float_scalars_stay_apart_when_lowered_again(tmp_path, use_store):  # noqa: F811
    use_store(tmp_path / "exact")

    def program(n):
        def f(x, y):
            return jt.triton_call(x, y, n, kernel=kernels.add_kernel, out_shape=VEC, grid=(4,), BLOCK=1024,
                                  compute_capability=90)
        return f

    firsts = {type(n): lower(program(n), (VEC, VEC)) for n in (4096, 4096.0)}
    assert firsts[int] != firsts[float]  # another kernel: an i32 parameter against an f32 one
    for _ in range(3):
        for n in (4096, 4096.0):
            assert lower(program(n), (VEC, VEC)) == firsts[type(n)]


def test_records_off_the_session_still_serves_a_call_again(tmp_path, use_store, planned):  # noqa: F811
    store = use_store(tmp_path / "off", call_records=False)
    _, fn, shapes = PROGRAMS[0]
    first = lower(fn, shapes)
    for _ in range(3):
        assert lower(fn, shapes) == first
    assert len(planned) == 2  # the second by its key from the session's own copy, then by signature
    assert not [key for key in store.disk.keys() if store.get(key)[0].meta.get("kind") == "lowered-call"]


def test_tuning_bypasses_the_session(tmp_path, use_store, planned):  # noqa: F811

    use_store(tmp_path / "tuning")
    _, fn, shapes = PROGRAMS[0]
    lower(fn, shapes)
    lower(fn, shapes)
    session = kernel_cache.current_session()
    session.tuning = object()
    try:
        lower(fn, shapes)
        assert len(planned) == 3  # planned again: nothing lowered may be reused while tuning
        assert call_records.find_signed("cuda", *([],) * 2, {}, session) == (None, None)
    finally:
        session.tuning = None
