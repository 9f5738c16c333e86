"""jax.Ref arguments (jax-triton 0.4): written in place, a call whose only outputs are Refs, a Ref
beside an allocated output, and jax-triton's error for Refs with input_output_aliases. CPU
cross-lowering for sm_90, the custom call decoded; numerics in tests/gpu/test_gpu_inplace.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from inspect_call import custom_calls
from test_inplace_readings import VEC, N, kinds

import lowering as jt
from scripts.jax_triton_04_programs import add_inplace_kernel, double_and_copy_kernel

pytestmark = pytest.mark.skipif(not hasattr(jax, "new_ref"),
                                reason=f"needs jax.new_ref (jax.Ref), which jax {jax.__version__} lacks: every stack's "
                                       "JAX has it (scripts/test.sh)")


def add_into_ref(x, y):
    y_ref = jax.new_ref(y)
    out = jt.triton_call(x, y_ref, x.size, kernel=add_inplace_kernel, out_shape=(), grid=(N // 256,), BLOCK=256,
                         INPLACE_Y=True, compute_capability=90)
    assert out == ()
    return y_ref[...]


def double_ref_and_copy(x):
    x_ref = jax.new_ref(x)
    copy = jt.triton_call(x_ref, x.size, kernel=double_and_copy_kernel, grid=(N // 256,), BLOCK=256,
                          out_shape=jax.ShapeDtypeStruct(x.shape, jnp.float16), compute_capability=90)
    return x_ref[...], copy


def lowered(fn, *shapes):
    return jax.jit(fn).trace(*shapes).lower(lowering_platforms=("cuda",))


def test_a_ref_is_written_in_place_and_the_call_needs_no_other_output():
    low = lowered(add_into_ref, VEC, VEC)
    (call,) = custom_calls(low)
    assert kinds(call) == ["array", "array", "i32"]  # no pointer beyond the Ref's own
    assert "operand_index = 1" in low.as_text()  # the call's result is y's buffer
    assert jax.eval_shape(add_into_ref, VEC, VEC).shape == (N,)


def test_a_ref_beside_an_allocated_output():
    low = lowered(double_ref_and_copy, VEC)
    (call,) = custom_calls(low)
    assert kinds(call) == ["array", "i32", "array"]
    assert "-> (tensor<4096xf16>, tensor<4096xf32>)" in low.as_text()
    doubled, copy = jax.eval_shape(double_ref_and_copy, VEC)
    assert (doubled.dtype, copy.dtype) == (jnp.float32, jnp.float16)


def test_refs_with_input_output_aliases_get_jax_tritons_error():
    def both(x, y):
        return jt.triton_call(x, jax.new_ref(y), x.size, kernel=add_inplace_kernel, out_shape=y, grid=(16,),
                              input_output_aliases={1: 0}, BLOCK=256, INPLACE_Y=True, compute_capability=90)
    with pytest.raises(ValueError, match="input_output_aliases cannot be combined with Ref arguments"):
        lowered(both, VEC, VEC)


def test_no_output_and_no_ref_is_still_an_error():
    with pytest.raises(ValueError, match="at least one output"):
        lowered(lambda x, y: jt.triton_call(x, y, x.size, kernel=add_inplace_kernel, out_shape=(), grid=(16,),
                                            BLOCK=256, INPLACE_Y=True, compute_capability=90), VEC, VEC)


def test_a_call_on_a_ref_whose_value_is_unused_still_lowers():
    def unused(x, y):
        add_into_ref(x, y)
        return x
    assert len(custom_calls(lowered(unused, VEC, VEC))) == 1
