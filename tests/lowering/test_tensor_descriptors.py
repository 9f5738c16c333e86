"""Host-side TMA descriptors (jax-triton 0.4's TensorDescriptor): compiled as Triton's tensordesc
parameter and launched as jaxlib's descriptor parameter, then the shape (i32) and strides (i64), as
jax-triton 0.4 does; refused with what is missing where jaxlib or Triton lacks them. CPU
cross-lowering for sm_90, the descriptor parameter decoded."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
import triton
from inspect_call import custom_calls

import lowering as jt
from lowering import tensor_descriptor
from lowering.payload import jaxlib_compat as compat
from scripts.jax_triton_04_programs import double_tile_kernel

MAT = jax.ShapeDtypeStruct((64, 128), jnp.float32)



def double(x, padding="zero"):
    desc = jt.TensorDescriptor.from_array(x, (16, 32), padding=padding)
    return jt.triton_call(desc, x.shape[1], kernel=double_tile_kernel, out_shape=x, grid=(4, 4), BLOCK_M=16,
                          BLOCK_N=32, compute_capability=90)


_LACKING = [what for what, there in (("jaxlib's create_tma_descriptor_parameter", compat.tma_descriptors_in_jaxlib()),
                                     (f"Triton >= 3.7 (this is {triton.__version__})", compat.tma_descriptors_in_triton()))
            if not there]
needs_tma = pytest.mark.skipif(bool(_LACKING), reason=f"needs {' and '.join(_LACKING)}, absent here: runs on the current "
                                                      "stacks (KERNEL_CACHE_STACKS=current scripts/test.sh)")


@needs_tma
@pytest.mark.parametrize("padding", ["zero", "nan"])
def test_a_descriptor_is_launched_with_its_shape_and_strides(padding):
    (call,) = custom_calls(jax.jit(lambda x: double(x, padding)).trace(MAT).lower(lowering_platforms=("cuda",)))
    params = call["kernel_call"]["parameters"]
    tma = params[0]["tma"]
    assert tma["shape"] == [64, 128] and tma["strides"] == [128, 1] and tma["block_shape"] == [16, 32]
    assert tma["elem_type"] == 7 and tma["oob_fill"] == (1 if padding == "nan" else 0)  # CU_TENSOR_MAP_DATA_TYPE_FLOAT32
    assert params[1:5] == [{"i32": 64}, {"i32": 128}, {"i64": 128}, {"i64": 1}]  # shape, then strides
    assert params[5] == {"i32": 128} and next(iter(params[6])) == "array"  # n_cols, out_ptr
    assert len(params) == 7


@needs_tma
def test_tf32_rounding_needs_float32():
    x16 = jax.ShapeDtypeStruct((64, 128), jnp.float16)
    with pytest.raises(ValueError, match="round_f32_to_tf32=True must have a float32 input type"):
        jax.jit(lambda x: jt.triton_call(jt.TensorDescriptor.from_array(x, (16, 32), round_f32_to_tf32=True),
                                         x.shape[1], kernel=double_tile_kernel, out_shape=x, grid=(4, 4), BLOCK_M=16,
                                         BLOCK_N=32, compute_capability=90)).trace(x16).lower(
            lowering_platforms=("cuda",))


def test_without_support_the_error_says_what_is_missing():
    if tensor_descriptor.supported():
        pytest.skip("needs a jaxlib without create_tma_descriptor_parameter or a Triton older than 3.7, to see "
                    "the error; this environment has both: runs on the oldest stack (jaxlib 0.10.2: "
                    "KERNEL_CACHE_STACKS=oldest scripts/test.sh)")
    with pytest.raises(jt.JaxlibSupportError, match="argument 0 is a TensorDescriptor .*"
                       "(create_tma_descriptor_parameter|older than 3.7)"):
        jax.jit(double).trace(MAT)
