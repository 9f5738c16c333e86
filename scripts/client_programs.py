# mypy: disable-error-code="no-untyped-def,untyped-decorator,no-untyped-call"
# (Triton kernels take no Python type annotations: Triton reads a kernel's annotations itself; and
# jax leaves ShapeDtypeStruct's constructor unannotated.)
"""Programs written against the client libraries' own APIs (jax-triton 0.3, ejKernel 0.0.80), unchanged:
what KERNEL_CACHE_INTERCEPT must serve. Shared by tests/clients/test_clients.py (cross-lowered on CPU),
tests/gpu/test_gpu_clients.py and scripts/bench_clients.py (run on a GPU).

Each program is (client, label, function, arguments); arguments are real arrays from a fixed seed.
Importing this module imports the clients: set KERNEL_CACHE_INTERCEPT before Python starts (or call
kernel_cache.intercept first) to have them served from the store.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl

Program = tuple[str, str, Callable[..., Any], tuple[Any, ...]]


@triton.jit
def _scaled_add(x_ptr, y_ptr, n, scale, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, (x + y) * scale, mask=mask)


@triton.autotune(configs=[triton.Config({"BLOCK": 128}, num_warps=4), triton.Config({"BLOCK": 256}, num_warps=8)],
                 key=["n"])
@triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})
@triton.jit
def _tuned_axpy_inplace(x_ptr, BLOCK: tl.constexpr, n, y_ptr, out_ptr, EVEN: tl.constexpr):
    """out = 2 * x + y with out aliasing y (in place); BLOCK, from the configs, sits before runtime
    parameters and the heuristic reads n: the binding jax-triton 0.3 itself gets wrong."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        tl.store(out_ptr + offs, 2.0 * tl.load(x_ptr + offs) + tl.load(y_ptr + offs))
    else:
        mask = offs < n
        tl.store(out_ptr + offs, 2.0 * tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask),
                 mask=mask)


def jax_triton_programs() -> list[Program]:
    import jax_triton as jt  # type: ignore[import-untyped]  # jax-triton ships no type information

    def add_keywords(x: Any, y: Any) -> Any:  # jax-triton 0.3: keyword scalars are compiled in
        return jt.triton_call(x, y, kernel=_scaled_add, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              grid=(jt.cdiv(x.size, 256),), n=x.size, scale=0.5, BLOCK=256)

    def add_positional(x: Any, y: Any) -> Any:  # positional scalars: n (i32) and a Python float (fp64 in jax-triton)
        return jt.triton_call(x, y, x.size, 3.0, kernel=_scaled_add,
                              out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              grid=lambda meta: (jt.cdiv(x.size, meta["BLOCK"]),), BLOCK=128)

    def axpy_inplace(x: Any, out: Any) -> Any:
        return jt.triton_call(x, x.size, out, kernel=_tuned_axpy_inplace,
                              out_shape=jax.ShapeDtypeStruct(out.shape, out.dtype),
                              grid=lambda meta: (jt.cdiv(x.size, meta["BLOCK"]),), input_output_aliases={1: 0})


    rng = np.random.default_rng(0)
    x, y = (jnp.asarray(rng.standard_normal(1000), jnp.float32) for _ in range(2))
    return [("jax_triton", "add_keywords", add_keywords, (x, y)),
            ("jax_triton", "add_positional", add_positional, (x, y)),
            ("jax_triton", "axpy_inplace_autotuned", axpy_inplace, (x, y))]


def ejkernel_programs() -> list[Program]:
    from ejkernel.kernels import _triton as ek  # untyped, and absent but on the oldest stack: pyproject.toml's mypy overrides

    rng = np.random.default_rng(0)

    def normal(*shape: int, dtype: Any = jnp.float32, scale: float = 1.0) -> Any:
        return jnp.asarray(rng.standard_normal(shape) * scale, dtype)

    q, k, v = (normal(1, 128, 2, 64, dtype=jnp.float16) for _ in range(3))

    def attention(q: Any, k: Any, v: Any) -> Any:
        return ek.flash_attention(q, k, v, causal=True)

    def attention_grad(q: Any, k: Any, v: Any) -> Any:
        return jax.grad(lambda q, k, v: ek.flash_attention(q, k, v, causal=True).astype(jnp.float32).sum(),
                        argnums=(0, 1, 2))(q, k, v)

    rq, rk, rv = (normal(1, 64, 2, 32, scale=0.1) for _ in range(3))
    decay = -jnp.exp(normal(1, 64, 2, 32, scale=0.1))
    bonus = normal(2, 32, scale=0.1)
    dq = normal(2, 4, 64, dtype=jnp.float16)
    dk, dv = (normal(2, 128, 2, 64, dtype=jnp.float16) for _ in range(2))
    starts, ends = jnp.zeros((2,), jnp.int32), jnp.asarray([100, 128], jnp.int32)
    found: list[Program] = [
        ("ejkernel", "flash_attention", attention, (q, k, v)),
        ("ejkernel", "flash_attention_grad", attention_grad, (q, k, v)),
        ("ejkernel", "mean_pooling", lambda x: ek.mean_pooling(x, chunk_size=32), (normal(2, 128, 64),)),
        ("ejkernel", "recurrent_gla", lambda a, b, c, g: ek.recurrent_gla(a, b, c, g)[0], (rq, rk, rv, decay)),
        ("ejkernel", "rwkv4", lambda w, u, a, b: ek.rwkv4(w, u, a, b)[0],
         (normal(64, scale=0.1), normal(64, scale=0.1), normal(1, 32, 64, scale=0.1), normal(1, 32, 64))),
        ("ejkernel", "rwkv6", lambda a, b, c, w, u: ek.rwkv6(a, b, c, w, u)[0], (rq, rk, rv, decay, bonus)),
    ]
    return found + ([("ejkernel", "ragged_decode_attention",  # tl.zeros([0]): Triton >= 3.7 refuses it, in either path
                      lambda a, b, c, s, e: ek.ragged_decode_attention(a, b, c, s, e), (dq, dk, dv, starts, ends))]
                    if tuple(int(p) for p in triton.__version__.split(".")[:2]) < (3, 7) else [])


def programs(clients: tuple[str, ...] = ("jax_triton", "ejkernel")) -> list[Program]:
    found: list[Program] = []
    if "jax_triton" in clients:
        found += jax_triton_programs()
    if "ejkernel" in clients:
        found += ejkernel_programs()
    return found
