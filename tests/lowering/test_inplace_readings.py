"""input_output_aliases read as jax-triton 0.3 (every output is a pointer) or 0.4 (an aliased output
has none: the kernel writes into the input's buffer), decided by the kernel's parameter count; CPU
cross-lowering for sm_90, the custom call decoded. Numerics: tests/gpu/test_gpu_inplace.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
import triton
import triton.language as tl
from inspect_call import custom_calls

import lowering as jt
from scripts.jax_triton_04_programs import add_inplace_kernel, double_and_copy_kernel

N = 4096
VEC = jax.ShapeDtypeStruct((N,), jnp.float32)




@triton.jit
def add_03_kernel(x_ptr, y_ptr, n, out_ptr, BLOCK: tl.constexpr):
    """jax-triton 0.3's form of the same in-place add: out_ptr is y's buffer again."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


def add_inplace(x, y, **kw):
    return jt.triton_call(x, y, x.size, kernel=add_inplace_kernel, out_shape=y, input_output_aliases={1: 0},
                          grid=(jt.cdiv(x.size, 256),), BLOCK=256, INPLACE_Y=True, compute_capability=90, **kw)


def double_and_copy(x):
    return jt.triton_call(x, x.size, kernel=double_and_copy_kernel, input_output_aliases={0: 0},
                          out_shape=[x, jax.ShapeDtypeStruct(x.shape, jnp.float16)], grid=(jt.cdiv(x.size, 256),),
                          BLOCK=256, compute_capability=90)


def lowered(fn, *shapes):
    return jax.jit(fn).trace(*shapes).lower(lowering_platforms=("cuda",))


def kinds(call) -> list[str]:
    return [next(iter(p)) for p in call["kernel_call"]["parameters"]]


def test_an_aliased_output_without_a_pointer_is_written_in_place():
    low = lowered(add_inplace, VEC, VEC)
    (call,) = custom_calls(low)
    assert kinds(call) == ["array", "array", "i32"]  # x, y, n: no pointer for the output
    text = low.as_text()
    assert "output_operand_aliases = [#stablehlo.output_operand_alias<output_tuple_indices = [], operand_index = 1" in text


def test_the_0_3_form_of_the_same_call_keeps_its_output_pointer():
    (call,) = custom_calls(lowered(
        lambda x, y: jt.triton_call(x, y, x.size, kernel=add_03_kernel, out_shape=y, input_output_aliases={1: 0},
                                    grid=(16,), BLOCK=256, compute_capability=90), VEC, VEC))
    assert kinds(call) == ["array", "array", "i32", "array"]


def test_pointer_outputs_come_first_and_the_users_order_is_kept():
    low = lowered(double_and_copy, VEC)
    (call,) = custom_calls(low)
    assert kinds(call) == ["array", "i32", "array"]  # x, n, the copy: the doubled x has no pointer
    text = low.as_text()
    # the call's results: the copy (f16, the kernel's third buffer) first, the aliased x last
    assert "-> (tensor<4096xf16>, tensor<4096xf32>)" in text
    assert "output_tuple_indices = [1], operand_index = 0" in text
    shapes = jax.eval_shape(double_and_copy, VEC)
    assert [(s.shape, s.dtype) for s in shapes] == [((N,), jnp.float32), ((N,), jnp.float16)]


def test_zeroing_an_aliased_output_without_a_pointer_zeroes_the_input():
    low = lowered(lambda x, y: add_inplace(x, y, zeroed_outputs=(0,)), VEC, VEC)
    (call,) = custom_calls(low)
    params = call["kernel_call"]["parameters"]
    assert params[1] == {"array": {"bytes_to_zero": N * 4, "ptr_divisibility": 16}}
    assert params[0]["array"]["bytes_to_zero"] == 0


def test_a_count_neither_reading_fits_names_both():
    with pytest.raises(TypeError, match="fits neither reading") as caught:
        lowered(lambda x, y: jt.triton_call(
            x, y, x.size, kernel=add_03_kernel, out_shape=[x, y], input_output_aliases={0: 0, 1: 1},
            grid=(16,), BLOCK=256, compute_capability=90), VEC, VEC)
    assert "jax-triton 0.3" in str(caught.value) and "jax-triton 0.4" in str(caught.value)
