"""The same call lowered again in a session (`lowering.records.call_memo`): served without planning,
keying or reading the store from its third lowering on, with the same custom call; keyed type-exactly
(1, 1.0, True, numpy's 1.0, -0.0 and 0.0 are different calls), by identity for objects without a
value form (kept alive by the key), by value for an Autotuner's editable configs; dropped with the
session's other memos."""

from __future__ import annotations

import copy
import gc
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import triton
from jax import core
from test_call_records import PROGRAMS, forget, lower, use_store  # noqa: F401  (fixture)

import kernel_cache
import lowering as jt
from compiler import examples as kernels
from lowering.frontend.frozen_items import FrozenItems
from lowering.planning import plan
from lowering.records import call_memo

VEC = jax.ShapeDtypeStruct((4096,), jnp.float32)
AVAL = core.ShapedArray((4096,), jnp.float32)


def key(**params):
    return call_memo.key_of("cuda", [AVAL], [AVAL], params, "module")


@pytest.mark.parametrize("a, b", [(1, 1.0), (1, True), (1.0, np.float32(1.0)), (0.0, -0.0), (2, np.int64(2)),
                                  (np.float32(1.0), np.float64(1.0)), ((1, 2), [1, 2]), ("1", 1)])
def test_values_that_python_calls_equal_are_different_calls(a, b):
    assert key(metaparams=FrozenItems([("SCALE", a)])) != key(metaparams=FrozenItems([("SCALE", b)]))
    copied = FrozenItems([("SCALE", copy.deepcopy(a))])
    assert key(metaparams=FrozenItems([("SCALE", a)])) == key(metaparams=copied)  # a value, not an object


def test_objects_are_keyed_by_identity_and_kept_alive():
    def make():
        def grid(meta):
            return (1,)
        return grid

    grid = make()
    found = key(grid=grid)
    assert found == key(grid=grid) and found != key(grid=make())
    alive = weakref.ref(grid)
    del grid
    gc.collect()
    assert alive() is not None  # its id cannot be reused while the key exists
    del found
    gc.collect()
    assert alive() is None


def _module_grid(meta):
    return (4,)


def test_closures_are_not_held():
    """A grid lambda over the operands is made anew at every trace: keying it would only keep what it
    closes over (tracers) alive, so such a call is not memoized; a function closing over nothing is."""
    n = 4096
    assert key(grid=lambda meta: (n // meta["BLOCK"],)) is None
    assert key(grid=_module_grid) == key(grid=_module_grid) is not None


def test_values_without_an_exact_form_are_not_memoized():
    class Loose:
        def __eq__(self, other):
            return True

        __hash__ = object.__hash__

    assert key(grid=Loose()) is None
    assert call_memo.key_of("cuda", [object()], [AVAL], {}, "module") is None


def test_an_edited_autotuner_is_another_call():
    tuner = triton.autotune(configs=[triton.Config({"BLOCK": 256}, num_warps=2)], key=["n"])(kernels.add_kernel)
    before = key(kernel=tuner)
    tuner.configs[0].num_warps = 4
    assert key(kernel=tuner) != before
    tuner.configs.append(triton.Config({"BLOCK": 512}, num_warps=4))
    assert len({before, key(kernel=tuner)}) == 2


def test_the_third_lowering_is_served_from_the_memo(tmp_path, use_store, monkeypatch):  # noqa: F811
    store = use_store(tmp_path / "memo")
    _, fn, shapes = PROGRAMS[0]  # add: a grid of ints, so the call's parameters repeat exactly
    planned = []
    real_of = plan.KernelPlan.of.__func__
    monkeypatch.setattr(plan.KernelPlan, "of", classmethod(lambda cls, *a: planned.append(1) or real_of(cls, *a)))
    first = lower(fn, shapes)  # kernel by kernel: compiled and recorded
    assert lower(fn, shapes) == first and len(planned) == 2  # served from its record, keyed exactly now
    hits = sum(store.stats.session()["record_hits"].values())
    for _ in range(3):
        assert lower(fn, shapes) == first
    assert len(planned) == 2  # neither planned nor keyed again
    assert sum(store.stats.session()["record_hits"].values()) == hits + 3  # each counted as one record hit
    forget()  # dropped with the session's memos
    assert lower(fn, shapes) == first and len(planned) == 3


def test_calls_with_grid_closures_are_lowered_as_before_and_not_kept(tmp_path, use_store):  # noqa: F811
    use_store(tmp_path / "closures")
    _, fn, shapes = PROGRAMS[1]  # scaled_add: its grid is a lambda over the operand, new at every trace
    first = lower(fn, shapes)
    for _ in range(3):
        assert lower(fn, shapes) == first
    memo = kernel_cache.current_session().memos.get("lowering.records.call_memo")
    assert memo is not None and memo.calls == {}  # nothing held for them


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


def test_typed_scalars_are_keyed_by_their_values():
    from compiler import Scalar

    assert key(scalars=((2, Scalar("fp32", 1.0)),)) == key(scalars=((2, Scalar("fp32", 1.0)),))
    assert key(scalars=((2, Scalar("fp32", 1.0)),)) != key(scalars=((2, Scalar("fp64", 1.0)),))
    assert key(scalars=((2, Scalar("fp64", 1)),)) != key(scalars=((2, Scalar("fp64", 1.0)),))
