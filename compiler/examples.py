# mypy: disable-error-code="no-untyped-def,untyped-decorator"
# (Triton kernels take no Python type annotations: Triton reads a kernel's annotations itself.)
"""Example Triton kernels: a small, real set to try kernel-cache on and to test and benchmark it with.

A vector add, a scaled add (through a called @jit function), a row softmax, a row layernorm, an
autotuned matmul (six configs) and a flash-attention forward. Parameters follow jax-triton's order
(inputs and scalars, then outputs, then constexprs), so the JAX programs in `lowering.examples` call
these same kernels. They live in an installed package so that the recipes recorded from them
(`compiler.examples:add_kernel`, ...) can be rebuilt by `cachectl prewarm --allow-module
'compiler.examples'` from any working directory. `example_specs(target)` gives a `KernelSpec` for
every compile the programs make, for use with `compiler.get_or_compile`.
"""

from typing import Any

import triton
import triton.language as tl

from .spec import KernelSpec, make_spec


@triton.jit
def _scale(x, s):
    return x * s


@triton.jit
def add_kernel(x_ptr, y_ptr, n, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


@triton.jit
def scaled_add_kernel(x_ptr, y_ptr, n, out_ptr, SCALE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, _scale(x, SCALE) + tl.load(y_ptr + offs, mask=mask), mask=mask)


@triton.jit
def softmax_kernel(x_ptr, n_cols, out_ptr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * n_cols + offs, mask=mask, other=-float("inf")).to(tl.float32)
    num = tl.exp(x - tl.max(x, axis=0))
    tl.store(out_ptr + row * n_cols + offs, num / tl.sum(num, axis=0), mask=mask)


@triton.jit
def layernorm_kernel(x_ptr, w_ptr, b_ptr, n_cols, eps, out_ptr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * n_cols + offs, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    diff = tl.where(mask, x - mean, 0.0)
    y = diff / tl.sqrt(tl.sum(diff * diff, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + offs, mask=mask)
    b = tl.load(b_ptr + offs, mask=mask)
    tl.store(out_ptr + row * n_cols + offs, y * w + b, mask=mask)


MATMUL_CONFIGS = [  # never mutated
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 32}, num_warps=4, num_stages=4),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 32}, num_warps=4, num_stages=4),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32}, num_warps=2, num_stages=3),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 64}, num_warps=2, num_stages=2),
]


@triton.autotune(configs=MATMUL_CONFIGS, key=["M", "N", "K"])
@triton.jit
def matmul_kernel(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn, c_ptr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=(rm[:, None] < M) & (rk[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(rk[:, None] < k_left) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def flash_attention_fwd_kernel(q_ptr, k_ptr, v_ptr, seq_len, sm_scale, o_ptr, HEAD_DIM: tl.constexpr,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One (batch*head, query block) per program; q/k/v/o are [BH, seq_len, HEAD_DIM] contiguous."""
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    base = bh * seq_len * HEAD_DIM
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=offs_m[:, None] < seq_len,
                other=0.0)
    m_i = tl.full((BLOCK_M,), -float("inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    for start_n in range(0, seq_len, BLOCK_N):
        cols = start_n + offs_n
        kv_mask = cols[:, None] < seq_len
        k = tl.load(k_ptr + base + cols[:, None] * HEAD_DIM + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + base + cols[:, None] * HEAD_DIM + offs_d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k)) * sm_scale
        s = tl.where(cols[None, :] < seq_len, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    acc = acc / l_i[:, None]
    tl.store(o_ptr + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], acc.to(o_ptr.dtype.element_ty),
             mask=offs_m[:, None] < seq_len)


def example_calls() -> list[tuple[str, Any, list[Any], dict[str, Any], dict[str, Any]]]:
    """(label, kernel, runtime args, constexprs, launch params) for every example kernel compile: the
    autotuned matmul's once per config, as a lowering compiles them."""
    mm_args: list[Any] = ["*fp16", "*fp16", 512, 512, 512, 512, 1, 512, 1, 512, 1, "*fp16"]
    return [
        ("add", add_kernel, ["*fp32", "*fp32", 4096, "*fp32"], {"BLOCK": 1024}, {}),
        ("scaled_add", scaled_add_kernel, ["*fp32", "*fp32", 4096, "*fp32"], {"SCALE": 0.5, "BLOCK": 1024}, {}),
        ("softmax", softmax_kernel, ["*fp32", 1000, "*fp32"], {"BLOCK": 1024}, {}),
        ("layernorm", layernorm_kernel, ["*fp32", "*fp32", "*fp32", 768, 1e-5, "*fp32"], {"BLOCK": 1024},
         {"num_warps": 8}),
        *((f"matmul[{i}]", matmul_kernel, mm_args, dict(cfg.kwargs), {"num_warps": cfg.num_warps,
                                                                     "num_stages": cfg.num_stages})
          for i, cfg in enumerate(MATMUL_CONFIGS)),
        ("flash_attention", flash_attention_fwd_kernel, ["*fp16", "*fp16", "*fp16", 1024, 0.125, "*fp16"],
         {"HEAD_DIM": 64, "BLOCK_M": 64, "BLOCK_N": 64}, {"num_warps": 4, "num_stages": 2}),
    ]


def example_specs(target: str = "sm_90") -> list[tuple[str, KernelSpec]]:
    """[(label, KernelSpec)] for every example compile, for `target`."""
    return [(label, make_spec(kernel, args, cst, target=target, **launch))
            for label, kernel, args, cst, launch in example_calls()]
