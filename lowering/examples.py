# mypy: disable-error-code="no-untyped-call"
# (jax leaves ShapeDtypeStruct's constructor unannotated.)
"""Example JAX programs calling Triton kernels through `lowering.triton_call`: the program set the
demo and the benchmarks run, and a template for your own.

Kernels come from `compiler.examples` and take jax-triton's argument order, so these programs run
unchanged under `import jax_triton as jt` (9 programs, 14 kernels). `programs()` is what
`cachectl prewarm lowering.examples:programs` lowers; `references()` checks the results on a GPU.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import triton

import lowering as jt
from compiler.examples import add_kernel as add
from compiler.examples import layernorm_kernel as layernorm
from compiler.examples import matmul_kernel as matmul
from compiler.examples import scaled_add_kernel as scaled_add
from compiler.examples import softmax_kernel as softmax

EPS = 1e-5


# An autotuned add (two configs) for in-place calls with aliases, which the autotuner must restore.
tuned_add = triton.autotune(configs=[triton.Config({"BLOCK": 256}, num_warps=2),
                                     triton.Config({"BLOCK": 512}, num_warps=4)], key=["n"])(add)


# Programs --------------------------------------------------------------------------------------
def add_program(x: Any, y: Any, *, block: int, **call: Any) -> Any:
    return jt.triton_call(x, y, x.size, kernel=add, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          grid=(jt.cdiv(x.size, block),), BLOCK=block, **call)


def scaled_add_program(x: Any, y: Any, *, scale: float, **call: Any) -> Any:
    return jt.triton_call(x, y, x.size, kernel=scaled_add, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          grid=lambda meta: (jt.cdiv(x.size, meta["BLOCK"]),), SCALE=scale, BLOCK=1024, **call)


def softmax_program(x: Any, **call: Any) -> Any:
    rows, cols = x.shape
    return jt.triton_call(x, cols, kernel=softmax, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          grid=(rows,), BLOCK=triton.next_power_of_2(cols), **call)


def layernorm_program(x: Any, w: Any, b: Any, **call: Any) -> Any:
    rows, cols = x.shape
    return jt.triton_call(x, w, b, cols, EPS, kernel=layernorm, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          grid=(rows,), BLOCK=triton.next_power_of_2(cols), num_warps=8, **call)


def matmul_program(a: Any, b: Any, **call: Any) -> Any:
    (m, k), (_, n) = a.shape, b.shape
    return jt.triton_call(a, b, m, n, k, k, 1, n, 1, n, 1, kernel=matmul,
                          out_shape=jax.ShapeDtypeStruct((m, n), a.dtype),
                          grid=lambda meta: (jt.cdiv(m, meta["BLOCK_M"]), jt.cdiv(n, meta["BLOCK_N"])), **call)


def programs(**call: Any) -> list[tuple[str, Callable[..., Any], tuple[Any, ...]]]:
    """[(label, function, example args)] for the whole set; `call` goes to every triton_call
    (e.g. compute_capability=90 for cross-lowering)."""
    n = 1 << 20
    vec = jax.ShapeDtypeStruct((n,), jnp.float32)
    rows = jax.ShapeDtypeStruct((4096, 1000), jnp.float32)
    ln = (jax.ShapeDtypeStruct((4096, 768), jnp.float32), jax.ShapeDtypeStruct((768,), jnp.float32),
          jax.ShapeDtypeStruct((768,), jnp.float32))
    mat = jax.ShapeDtypeStruct((1024, 1024), jnp.float16)
    out: list[tuple[str, Callable[..., Any], tuple[Any, ...]]] = [
        (f"add[BLOCK={b}]", functools.partial(add_program, block=b, **call), (vec, vec)) for b in (256, 512, 1024, 2048)]
    out += [(f"scaled_add[{s}]", functools.partial(scaled_add_program, scale=s, **call), (vec, vec))
            for s in (0.5, 2.0)]
    out += [("softmax", functools.partial(softmax_program, **call), (rows,)),
            ("layernorm", functools.partial(layernorm_program, **call), ln),
            ("matmul[autotuned x6]", functools.partial(matmul_program, **call), (mat, mat))]
    return out


def inplace_tuned_add(x: Any, y: Any, **call: Any) -> Any:
    """x += y in place (out aliases x) through the 2-config autotuned add."""
    return jt.triton_call(x, y, x.size, kernel=tuned_add, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          input_output_aliases={0: 0}, grid=lambda meta: (jt.cdiv(x.size, meta["BLOCK"]),), **call)


def launch_bound_chain(x: Any, y: Any, *, steps: int = 64, **call: Any) -> Any:
    """A chain of `steps` tiny autotuned adds (x + steps * y): its step time is kernel launches."""
    size = x.size
    for _ in range(steps):
        x = jt.triton_call(x, y, size, kernel=tuned_add, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                           grid=lambda meta: (jt.cdiv(size, meta["BLOCK"]),), **call)
    return x


def tune_programs() -> list[tuple[str, Callable[..., Any], tuple[Any, ...]]]:
    """What `cachectl tune lowering.examples:tune_programs` times on a GPU: the autotuned matmul of
    the program set and the in-place autotuned add (its input donated), on real inputs."""
    mat = jax.ShapeDtypeStruct((1024, 1024), jnp.float16)
    vec = jax.ShapeDtypeStruct((1 << 16,), jnp.float32)
    return [("matmul[autotuned x6]", matmul_program, random_inputs((mat, mat))),
            ("tuned_add[in place]", jax.jit(inplace_tuned_add, donate_argnums=0), random_inputs((vec, vec), seed=3))]


def launch_bound_programs() -> list[tuple[str, Callable[..., Any], tuple[Any, ...]]]:
    """The launch-bound chain (64 tiny autotuned adds on 4096 floats) for `cachectl tune`."""
    vec = jax.ShapeDtypeStruct((4096,), jnp.float32)
    return [("launch_bound_chain", launch_bound_chain, random_inputs((vec, vec)))]


def references() -> dict[str, Callable[..., Any]]:
    """label -> jnp reference of the same computation (for numerics checks on a GPU)."""
    def ln_ref(x: Any, w: Any, b: Any) -> Any:
        mean = x.mean(-1, keepdims=True)
        return (x - mean) / jnp.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + EPS) * w + b

    refs: dict[str, Callable[..., Any]] = {f"add[BLOCK={b}]": lambda x, y: x + y for b in (256, 512, 1024, 2048)}
    refs.update({f"scaled_add[{s}]": (lambda x, y, s=s: x * s + y) for s in (0.5, 2.0)})
    refs["softmax"] = lambda x: jax.nn.softmax(x, axis=-1)
    refs["layernorm"] = ln_ref
    refs["matmul[autotuned x6]"] = lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32).astype(a.dtype)
    return refs


def random_inputs(shapes: Sequence[Any], seed: int = 0) -> tuple[Any, ...]:
    rng = np.random.default_rng(seed)
    return tuple(jnp.asarray(rng.standard_normal(s.shape).astype(s.dtype)) for s in shapes)
