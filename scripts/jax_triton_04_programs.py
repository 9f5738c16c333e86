# mypy: disable-error-code="no-untyped-def,untyped-decorator,no-untyped-call"
# (Triton kernels take no Python type annotations: Triton reads a kernel's annotations itself; and
# jax leaves ShapeDtypeStruct's constructor unannotated.)
"""Programs written for jax-triton 0.4's API: in-place aliasing without an output pointer, tuple
arguments (nested, mixed dtypes, a scalar before one, autotuned), jax.Ref arguments (alone, beside an
allocated output, inside a tuple), `out_type`, keyword operands, cost estimates, a call whose outputs
are unused (never removed) and, where jaxlib and Triton have them, a host-side TMA descriptor.
`programs(jt)` runs them through `jt`: `jax_triton` 0.4 itself (interception tests, cross-lowered on
CPU) or `lowering` (the GPU check, where Triton 3.6 cannot host jax-triton 0.4).

Each program is (label, function, arguments, reference function); arguments are real arrays from a
fixed seed, and the reference computes the same result with jax.numpy.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl

N = 4096
Program = tuple[str, Callable[..., Any], tuple[Any, ...], Callable[..., Any]]


@triton.jit
def add_inplace_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, INPLACE_Y: tl.constexpr):
    """No output pointer: the sum lands in y (or x), whose buffer becomes the output."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    total = tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask)
    if INPLACE_Y:
        tl.store(y_ptr + offs, total, mask=mask)
    else:
        tl.store(x_ptr + offs, total, mask=mask)


@triton.jit
def double_and_copy_kernel(x_ptr, n, copy_ptr, BLOCK: tl.constexpr):
    """Doubles x in place and writes x's old value, as f16, to a new output."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(copy_ptr + offs, x.to(tl.float16), mask=mask)
    tl.store(x_ptr + offs, x * 2, mask=mask)


@triton.jit
def add_tuple_kernel(x_ptr, yz, n, out_ptr, BLOCK: tl.constexpr):
    """out = x + y + z with (y, z) one tuple parameter (y may be f16)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    y_ptr, z_ptr = yz
    total = tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask).to(tl.float32)
    tl.store(out_ptr + offs, total + tl.load(z_ptr + offs, mask=mask).to(tl.float32), mask=mask)


@triton.jit
def scaled_nested_kernel(scale, pairs, n, out_ptr, BLOCK: tl.constexpr):
    """A scalar before a nested tuple: out = scale * (a + b + c), pairs = ((a, b), c)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    ab, c_ptr = pairs
    a_ptr, b_ptr = ab
    total = tl.load(a_ptr + offs, mask=mask) + tl.load(b_ptr + offs, mask=mask) + tl.load(c_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, total * scale, mask=mask)


@triton.jit
def accumulate_tuple_kernel(x_ptr, acc, n, BLOCK: tl.constexpr):
    """acc = (a, b): a += x and b += 2x, in place (Refs inside a tuple)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a_ptr, b_ptr = acc
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(a_ptr + offs, tl.load(a_ptr + offs, mask=mask) + x, mask=mask)
    tl.store(b_ptr + offs, tl.load(b_ptr + offs, mask=mask) + 2 * x, mask=mask)


@triton.jit
def double_tile_kernel(in_desc, n_cols, out_ptr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """out = 2 * x, read through a host-side TMA descriptor of x."""
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    tile = in_desc.load([pid_m * BLOCK_M, pid_n * BLOCK_N])
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    tl.store(out_ptr + rows * n_cols + cols, tile * 2)


tuned_tuple_kernel = triton.autotune(configs=[triton.Config({"BLOCK": b}) for b in (128, 256)], key=["n"])(
    add_tuple_kernel)


def programs(jt: ModuleType, compute_capability: int | None = None, tma: bool = False) -> list[Program]:
    """The programs through `jt` (jax_triton 0.4 or lowering). `compute_capability`: None on a GPU,
    90 to cross-lower for sm_90 without one; `tma`: also one reading through a TensorDescriptor (where
    jaxlib and Triton >= 3.7 have them)."""
    cc = {"compute_capability": compute_capability}
    grid = (N // 256,)

    def inplace(x: Any, y: Any) -> Any:
        return jt.triton_call(x, y, x.size, kernel=add_inplace_kernel, out_type=y, input_output_aliases={1: 0},
                              grid=grid, BLOCK=256, INPLACE_Y=True, **cc)

    def double_copy(x: Any) -> Any:
        return jt.triton_call(x, x.size, kernel=double_and_copy_kernel, input_output_aliases={0: 0}, grid=grid,
                              out_type=[x, jax.ShapeDtypeStruct(x.shape, jnp.float16)], BLOCK=256, **cc)

    def tuple_mixed(x: Any, y: Any, z: Any) -> Any:
        return jt.triton_call(x, (y, z), x.size, kernel=add_tuple_kernel, out_type=x, grid=grid, BLOCK=256, **cc)

    def nested(a: Any, b: Any, c: Any) -> Any:
        return jt.triton_call(2.0, ((a, b), c), a.size, kernel=scaled_nested_kernel, out_type=a, grid=grid,
                              BLOCK=256, **cc)

    def tuned_tuple(x: Any, y: Any, z: Any) -> Any:
        return jt.triton_call(x, (y, z), x.size, kernel=tuned_tuple_kernel, out_type=x,
                              grid=lambda m: (triton.cdiv(x.size, m["BLOCK"]),), **cc)

    def ref_only(x: Any, y: Any) -> Any:
        y_ref = jax.new_ref(y)
        jt.triton_call(x, y_ref, x.size, kernel=add_inplace_kernel, out_type=(), grid=grid, BLOCK=256,
                       INPLACE_Y=True, **cc)
        return y_ref[...]

    def ref_and_output(x: Any) -> Any:
        x_ref = jax.new_ref(x)
        copy = jt.triton_call(x_ref, x.size, kernel=double_and_copy_kernel, grid=grid, BLOCK=256,
                              out_type=jax.ShapeDtypeStruct(x.shape, jnp.float16), **cc)
        return x_ref[...], copy

    def refs_in_tuple(x: Any, a: Any, b: Any) -> Any:
        a_ref, b_ref = jax.new_ref(a), jax.new_ref(b)
        jt.triton_call(x, (a_ref, b_ref), x.size, kernel=accumulate_tuple_kernel, out_type=(), grid=grid,
                       BLOCK=256, **cc)
        return a_ref[...], b_ref[...]

    def keyword_operand(x: Any, y: Any) -> Any:  # y_ptr= names a runtime parameter: an operand; n= a static scalar
        return jt.triton_call(x, y_ptr=y, n=x.size, kernel=add_inplace_kernel, out_type=y,
                              input_output_aliases={1: 0}, grid=grid, BLOCK=256, INPLACE_Y=True, **cc)

    def unused_result(x: Any, y: Any) -> Any:  # the call writes y's buffer; nothing reads its result: it still runs
        y_ref = jax.new_ref(y)
        jt.triton_call(x, y_ref, x.size, kernel=add_inplace_kernel, out_type=(), grid=grid, BLOCK=256,
                       INPLACE_Y=True, **cc)
        return x

    def with_cost(x: Any, y: Any, z: Any) -> Any:
        return jt.triton_call(x, (y, z), x.size, kernel=add_tuple_kernel, out_type=x, grid=grid, BLOCK=256,
                              cost_estimate={"flops": 2 * N, "bytes_accessed": 16 * N}, **cc)

    def tma_double(m: Any) -> Any:
        desc = jt.TensorDescriptor.from_array(m, (16, 32))
        return jt.triton_call(desc, m.shape[1], kernel=double_tile_kernel, out_type=m, grid=(4, 4), BLOCK_M=16,
                              BLOCK_N=32, **cc)

    rng = np.random.default_rng(4)
    x, y, z = (jnp.asarray(rng.standard_normal(N), jnp.float32) for _ in range(3))
    h = jnp.asarray(rng.standard_normal(N), jnp.float16)
    return [
        ("inplace", inplace, (x, y), lambda x, y: x + y),
        ("double_copy", double_copy, (x,), lambda x: [2 * x, x.astype(jnp.float16)]),
        ("tuple_mixed", tuple_mixed, (x, h, z), lambda x, h, z: x + h.astype(jnp.float32) + z),
        ("nested", nested, (x, y, z), lambda a, b, c: 2.0 * (a + b + c)),
        ("tuned_tuple", tuned_tuple, (x, y, z), lambda x, y, z: x + y + z),
        ("ref_only", ref_only, (x, y), lambda x, y: x + y),
        ("ref_and_output", ref_and_output, (x,), lambda x: (2 * x, x.astype(jnp.float16))),
        ("refs_in_tuple", refs_in_tuple, (x, y, z), lambda x, a, b: (a + x, b + 2 * x)),
        ("keyword_operand", keyword_operand, (x, y), lambda x, y: x + y),
        ("unused_result", unused_result, (x, y), lambda x, y: x),
        ("with_cost", with_cost, (x, y, z), lambda x, y, z: x + y + z),
    ] + ([("tma_double", tma_double, (jnp.asarray(rng.standard_normal((64, 128)), jnp.float32),), lambda m: 2 * m)]
         if tma else [])
