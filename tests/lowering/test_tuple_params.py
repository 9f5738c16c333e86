"""Triton tuple parameters (jax-triton 0.4): a tuple (or nested tuple) of arrays passed as one
argument, mixed dtypes in a tuple, a scalar before a tuple, an autotuned kernel taking a tuple, a
Ref inside a tuple; and jax-triton 0.3's flattening where the kernel's parameter count says so.
CPU cross-lowering for sm_90, the custom call decoded; numerics in tests/gpu/test_gpu_inplace.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
import triton
import triton.language as tl
from inspect_call import custom_calls
from test_call_records import call_entry, entries, forget, lower
from test_inplace_readings import VEC, N, kinds

import kernel_cache
import lowering as jt
from scripts.jax_triton_04_programs import add_tuple_kernel, scaled_nested_kernel, tuned_tuple_kernel

HALF = jax.ShapeDtypeStruct((N,), jnp.float16)




@triton.jit
def add_three_kernel(x_ptr, y_ptr, z_ptr, n, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    total = tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask) + tl.load(z_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, total, mask=mask)



def add_tuple(x, y, z, kernel=add_tuple_kernel, **kw):
    return jt.triton_call(x, (y, z), x.size, kernel=kernel, out_shape=x, compute_capability=90,
                          grid=lambda m: (jt.cdiv(x.size, m["BLOCK"]),), **kw)


def lowered(fn, *shapes):
    return jax.jit(fn).trace(*shapes).lower(lowering_platforms=("cuda",))


def test_a_tuple_of_arrays_is_one_parameter_with_mixed_dtypes():
    low = lowered(lambda x, y, z: add_tuple(x, y, z, BLOCK=256), VEC, HALF, VEC)
    (call,) = custom_calls(low)
    assert kinds(call) == ["array", "array", "array", "i32", "array"]  # x, (y, z) flattened for jaxlib, n, out
    (same,) = custom_calls(lowered(lambda x, y, z: add_tuple(x, y, z, BLOCK=256), VEC, VEC, VEC))
    assert call["kernel_call"]["kernel"] != same["kernel_call"]["kernel"]  # y's dtype inside the tuple is compiled in


def test_a_scalar_before_a_nested_tuple():
    fn = lambda a, b, c: jt.triton_call(2.0, ((a, b), c), a.size, kernel=scaled_nested_kernel, out_shape=a,  # noqa: E731
                                        grid=(N // 256,), BLOCK=256, compute_capability=90)
    (call,) = custom_calls(lowered(fn, VEC, VEC, VEC))
    params = call["kernel_call"]["parameters"]
    assert kinds(call) == ["f32", "array", "array", "array", "i32", "array"]
    assert params[0] == {"f32": 2.0}


def test_an_autotuned_kernel_taking_a_tuple():
    (call,) = custom_calls(lowered(lambda x, y, z: add_tuple(x, y, z, kernel=tuned_tuple_kernel), VEC, VEC, VEC))
    configs = call["autotuned"]["configs"]
    assert sorted(c["kernel_call"]["grid"][0] for c in configs) == [N // 256, N // 128]
    assert all(len(c["kernel_call"]["parameters"]) == 5 for c in configs)


def test_a_ref_inside_a_tuple_is_written_in_place():
    if not hasattr(jax, "new_ref"):
        pytest.skip(f"needs jax.new_ref (jax.Ref), which jax {jax.__version__} lacks: every stack's JAX has it "
                    "(scripts/test.sh)")

    def fn(x, y, z):
        z_ref = jax.new_ref(z)
        out = add_tuple(x, y, z_ref, BLOCK=256)
        return out, z_ref[...]
    low = lowered(fn, VEC, VEC, VEC)
    (call,) = custom_calls(low)
    assert kinds(call) == ["array", "array", "array", "i32", "array"]
    assert "operand_index = 2" in low.as_text()


def test_a_kernel_with_one_parameter_per_leaf_gets_the_tuple_flattened():
    """jax-triton 0.3 flattened every pytree argument: a kernel written for that still lowers."""
    fn = lambda x, y, z: jt.triton_call(x, (y, z), x.size, kernel=add_three_kernel, out_shape=x,  # noqa: E731
                                        grid=(N // 256,), BLOCK=256, compute_capability=90)
    (call,) = custom_calls(lowered(fn, VEC, VEC, VEC))
    assert kinds(call) == ["array", "array", "array", "i32", "array"]


def test_a_tuple_count_fitting_no_reading_names_both():
    with pytest.raises(TypeError, match="tuple parameters .*flattened"):
        lowered(lambda x, y, z: jt.triton_call(x, (y, z), (x, y), x.size, kernel=add_tuple_kernel, out_shape=x,
                                               grid=(16,), BLOCK=256, compute_capability=90), VEC, VEC, VEC)


@pytest.fixture
def store(tmp_path):
    yield kernel_cache.configure(kernel_cache.Config(dir=tmp_path / "cache"))
    kernel_cache.configure()


def test_a_tuple_call_is_recorded_and_served_from_its_record_alone(store):
    fn = lambda x, y, z: add_tuple(x, y, z, BLOCK=512)  # noqa: E731
    first = lower(fn, (VEC, HALF, VEC))
    assert len(entries(store, call_entry.KIND)) == 1
    for key in entries(store, "triton-kernel"):  # the kernel goes; the record must suffice
        store.delete(key)
    forget()
    before = store.stats.session()
    assert lower(fn, (VEC, HALF, VEC)) == first
    assert store.stats.session()["compiles"] == before["compiles"]
