# mypy: disable-error-code="no-untyped-def,no-untyped-call,misc"
# (jax's Primitive and custom_vjp are unannotated; the lowering rules take jax's untyped context.)
"""TransformerEngine's own Triton path, run for real: TE's `triton_call_lowering` (its
jax/triton_extensions/utils.py) and its MoE permutation kernels (common/triton/permutation.py),
from TE's pure-Python wheel, driven by small primitives that lower as TE's permutation primitives
do. Shared by tests/support/te_child.py (cross-lowered on CPU) and scripts/bench_te.py (run on a GPU).

TE's package __init__ files load its C++ core (transformer_engine_jax), which only a CUDA build of TE
has: `load()` puts empty packages in their place and serves the four modules this needs from the
wheel's files; any other TE module stays unimportable. What is ours: the primitives (TE's are
custom_partitioning wrappers over BasePrimitive, in a module that needs the core), their abstract
evaluation, and the custom VJPs of dispatch and combine; the grid, constexprs and aliases each
lowering passes are TE 2.20's.

Importing this module imports neither TE nor kernel-cache; set KERNEL_CACHE_INTERCEPT before Python
starts (or call kernel_cache.intercept) to have TE's calls served from the store.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import sys
import tempfile
import types
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import mlir

ROOT = Path(__file__).resolve().parent.parent
TE_VERSION = "2.20.2"
WHEEL = ROOT / ".whl" / f"transformer_engine-{TE_VERSION}-py3-none-any.whl"
MISSING = (f"TransformerEngine's pure-Python wheel (transformer-engine=={TE_VERSION}) is neither installed nor in "
           f".whl/: `pip install --no-deps transformer-engine=={TE_VERSION}` (scripts/setup_env.sh does), or "
           f"`bash scripts/gpu_client_wheels.sh` to download it into .whl/")
# The modules run from TE's files, by their path in the package; the packages above them stay empty.
MODULES = {
    "transformer_engine.jax.version_utils": "jax/version_utils.py",
    "transformer_engine.jax.triton_extensions.utils": "jax/triton_extensions/utils.py",
    "transformer_engine.common.triton": "common/triton/__init__.py",
    "transformer_engine.common.triton.permutation": "common/triton/permutation.py",
}
EMPTY_PACKAGES = ("transformer_engine", "transformer_engine.jax", "transformer_engine.common",
                  "transformer_engine.jax.triton_extensions")
# MoE shapes: tokens, hidden size (bf16), experts, experts per token, padding alignment
TOKENS, HIDDEN, EXPERTS, TOP_K, ALIGN = 4096, 4096, 64, 8, 128
ROW_ID_BLOCK = 1024  # TE's DEFAULT_BLOCK_SIZE for the row-id-map passes

Program = tuple[str, Callable[..., Any], tuple[Any, ...]]


def te_package_dir() -> Path | None:
    """TE's package directory: the installed one (found, not imported), else one extracted from .whl/."""
    if "transformer_engine" in sys.modules:
        return getattr(sys.modules["transformer_engine"], "__te_files__", None)
    spec = importlib.util.find_spec("transformer_engine")
    if spec is not None and spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    return _extracted(WHEEL) if WHEEL.is_file() else None


def te_version() -> str:
    try:
        return importlib.metadata.version("transformer-engine")
    except importlib.metadata.PackageNotFoundError:
        return f"{TE_VERSION} (.whl/)"


def _extracted(wheel: Path) -> Path:
    """The wheel's modules this needs, once per wheel, in the temporary directory."""
    dest = Path(tempfile.gettempdir()) / f"kernel-cache-{wheel.stem}"
    if not all((dest / "transformer_engine" / rel).is_file() for rel in MODULES.values()):
        tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=dest.parent))
        with zipfile.ZipFile(wheel) as z:
            for rel in MODULES.values():
                z.extract(f"transformer_engine/{rel}", tmp)
        try:
            os.replace(tmp, dest)
        except OSError:  # another process got there first (or a partial copy is in the way)
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
            if not all((dest / "transformer_engine" / rel).is_file() for rel in MODULES.values()):
                raise
    return dest / "transformer_engine"


class _WheelFiles(importlib.abc.MetaPathFinder):
    """Finds the modules of MODULES in TE's files, and nothing else; behind every other finder, so an
    import watcher in front of it (KERNEL_CACHE_INTERCEPT's) sees these imports as any other."""

    def __init__(self, package_dir: Path) -> None:
        self.package_dir = package_dir

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        rel = MODULES.get(fullname)
        if rel is None:
            return None
        package = rel.endswith("__init__.py")
        return importlib.util.spec_from_file_location(fullname, self.package_dir / rel,
                                                      submodule_search_locations=[] if package else None)


@functools.cache
def load() -> types.SimpleNamespace:
    """TE's utils and permutation kernel modules, run from its files, its package __init__s not run."""
    package_dir = te_package_dir()
    if package_dir is None:
        raise ModuleNotFoundError(MISSING)
    for name in EMPTY_PACKAGES:
        module = types.ModuleType(name, "empty: TE's own __init__ loads its C++ core (transformer_engine_jax)")
        module.__path__ = []  # no files: only _WheelFiles finds a module under it
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        module.__te_files__ = package_dir  # type: ignore[attr-defined]  # read back by te_package_dir
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, module)
    sys.meta_path.append(_WheelFiles(package_dir))
    return types.SimpleNamespace(
        utils=importlib.import_module("transformer_engine.jax.triton_extensions.utils"),
        kernels=importlib.import_module("transformer_engine.common.triton.permutation"),
        package_dir=package_dir, version=te_version())


def _te_call(ctx, kernel: str, *arrays, **launch):
    """TE's triton_call_lowering as its module holds it now (interception replaces it there)."""
    te = load()
    return te.utils.triton_call_lowering(ctx, getattr(te.kernels, kernel), *arrays, **launch)


def _min_block(kernel: str, default: int = 128) -> int:
    """TE's fallback BLOCK_SIZE among the constexprs: its smallest autotune config's."""
    configs = getattr(getattr(load().kernels, kernel), "configs", None)
    return min(c.kwargs.get("BLOCK_SIZE", default) for c in configs) if configs else default


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _aval(shape: tuple[int, ...], dtype: Any) -> jax.core.ShapedArray:
    return jax.core.ShapedArray(shape, jnp.dtype(dtype))


def _primitive(name: str, abstract: Callable[..., Any], lowering: Callable[..., Any], multiple: bool = True) -> Primitive:
    p = Primitive(name)
    p.multiple_results = multiple
    p.def_abstract_eval(abstract)
    mlir.register_lowering(p, lowering, platform="cuda")
    return p


# -- the row-id map: three passes ---------------------------------------------------------------------------
def _map_shapes(num_tokens, num_experts, block_size):
    return _aval((num_tokens, 2 * num_experts + 1), jnp.int32), _aval((num_experts, _cdiv(num_tokens, block_size)), jnp.int32)


def _pass1_lowering(ctx, routing_map, *, num_tokens, num_experts, block_size):
    return _te_call(ctx, "_row_id_map_pass_1_kernel", routing_map, grid=(num_experts, _cdiv(num_tokens, block_size)),
                    constexprs={"num_tokens": num_tokens, "stride_routing_map_token": num_experts,
                                "stride_routing_map_expert": 1, "stride_row_id_map_token": 2 * num_experts + 1,
                                "stride_row_id_map_expert": 1, "BLOCK_SIZE": block_size})


def _pass2_lowering(ctx, row_id_map, workspace, *, num_tokens, num_experts, block_size):
    blocks = _cdiv(num_tokens, block_size)
    return _te_call(ctx, "_row_id_map_pass_2_kernel", row_id_map, workspace, grid=(num_experts, blocks),
                    input_output_aliases={0: 0, 1: 1},
                    constexprs={"num_tokens": num_tokens, "stride_row_id_map_token": 2 * num_experts + 1,
                                "stride_row_id_map_expert": 1, "WORKSPACE_LOAD_WIDTH": _pow2(num_experts * blocks),
                                "BLOCK_SIZE": block_size})


def _pass3_lowering(ctx, row_id_map, *, num_tokens, num_experts):
    return _te_call(ctx, "_row_id_map_pass_3_kernel", row_id_map, grid=(num_tokens,), input_output_aliases={0: 0},
                    constexprs={"stride_row_id_map_token": 2 * num_experts + 1, "stride_row_id_map_expert": 1,
                                "num_experts": num_experts, "LOAD_SIZE": _pow2(num_experts)})


pass1_p = _primitive("te_row_id_map_pass1_triton", lambda r, **kw: _map_shapes(**kw), _pass1_lowering)
pass2_p = _primitive("te_row_id_map_pass2_triton", lambda m, w, **kw: _map_shapes(**kw), _pass2_lowering)
pass3_p = _primitive("te_row_id_map_pass3_triton", lambda m, *, num_tokens, num_experts: m, _pass3_lowering,
                     multiple=False)


def make_row_id_map(routing_map):
    """[tokens, 2 * experts + 1]: per token its destination rows, their experts, and how many."""
    num_tokens, num_experts = routing_map.shape
    shape = {"num_tokens": num_tokens, "num_experts": num_experts}
    row_id_map, workspace = pass1_p.bind(routing_map, block_size=ROW_ID_BLOCK, **shape)
    row_id_map, _ = pass2_p.bind(row_id_map, workspace, block_size=ROW_ID_BLOCK, **shape)
    return pass3_p.bind(row_id_map.at[:, num_experts:].set(-1), **shape)


# -- permute: tokens to their experts' rows ------------------------------------------------------------------
def _permute_abstract(inp, row_id_map, probs, scale, permuted_scale, pad_offsets, output_buf, probs_buf, *,
                      num_tokens, num_experts, num_out_tokens, hidden_size, with_probs, with_pad):
    permuted_probs = _aval((num_out_tokens,), probs.dtype) if with_probs else _aval((0,), inp.dtype)
    return _aval((num_out_tokens, hidden_size), inp.dtype), permuted_probs


def _permute_lowering(ctx, *arrays, num_tokens, num_experts, num_out_tokens, hidden_size, with_probs, with_pad):
    probs_2d = with_probs and len(ctx.avals_in[2].shape) > 1
    probs_strides = (num_experts, 1) if probs_2d else (1, 1) if with_probs else (0, 0)
    aliases = ({6: 0, 7: 1} if with_probs else {6: 0}) if with_pad else None  # the pre-zeroed buffers
    return _te_call(
        ctx, "_permute_kernel", *arrays, grid=lambda meta: (num_tokens, _cdiv(hidden_size, meta["BLOCK_SIZE"])),
        input_output_aliases=aliases,
        constexprs={"scale_hidden_dim": 0, "num_tokens": num_tokens, "num_out_tokens": num_out_tokens,
                    "stride_row_id_map_token": 2 * num_experts + 1, "stride_row_id_map_expert": 1,
                    "stride_input_token": hidden_size, "stride_input_hidden": 1,
                    "stride_output_token": hidden_size, "stride_output_hidden": 1,
                    "stride_probs_token": probs_strides[0], "stride_probs_expert": probs_strides[1],
                    "stride_scale_token": hidden_size, "stride_scale_hidden": 1, "stride_permuted_probs_token": 1,
                    "stride_permuted_scale_token": hidden_size, "stride_permuted_scale_hidden": 1,
                    "num_experts": num_experts, "hidden_size": hidden_size, "PERMUTE_PROBS": with_probs,
                    "PERMUTE_SCALE": False, "FUSION_PAD": with_pad, "BLOCK_SIZE": _min_block("_permute_kernel")})


permute_p = _primitive("te_permute_with_mask_map_triton", _permute_abstract, _permute_lowering)


def permute(inp, row_id_map, probs, pad_offsets, num_out_tokens):
    """(output [num_out_tokens, hidden], permuted probs or None); padded where pad_offsets is given."""
    num_tokens, hidden_size = inp.shape
    num_experts = (row_id_map.shape[1] - 1) // 2
    with_probs, with_pad = probs is not None, pad_offsets is not None
    probs = probs if with_probs else jnp.zeros((0,), inp.dtype)
    # the buffers the kernel writes through (aliased when padding: then their zeros are the padding)
    output_buf = jnp.zeros((num_out_tokens, hidden_size), inp.dtype)
    probs_buf = jnp.zeros((num_out_tokens,), probs.dtype) if with_probs else jnp.zeros((0,), inp.dtype)
    pad = pad_offsets if with_pad else jnp.zeros((0,), jnp.int32)
    out, permuted_probs = permute_p.bind(inp, row_id_map, probs, inp, inp, pad, output_buf, probs_buf,
                                         num_tokens=num_tokens, num_experts=num_experts, num_out_tokens=num_out_tokens,
                                         hidden_size=hidden_size, with_probs=with_probs, with_pad=with_pad)
    return out, permuted_probs if with_probs else None


# -- unpermute: experts' rows back to tokens, merged -----------------------------------------------------------
def _unpermute_abstract(inp, row_id_map, merging_probs, permuted_probs, pad_offsets, output_buf, probs_buf, *,
                        num_tokens, num_experts, hidden_size, with_merging_probs, with_probs, with_unpad):
    probs = _aval((num_tokens, num_experts), permuted_probs.dtype) if with_probs else _aval((0,), inp.dtype)
    return _aval((num_tokens, hidden_size), inp.dtype), probs


def _unpermute_lowering(ctx, *arrays, num_tokens, num_experts, hidden_size, with_merging_probs, with_probs,
                        with_unpad):
    merging = (num_experts, 1) if with_merging_probs else (0, 0)
    return _te_call(
        ctx, "_unpermute_kernel", *arrays, grid=lambda meta: (num_tokens, _cdiv(hidden_size, meta["BLOCK_SIZE"])),
        constexprs={"stride_row_id_map_token": 2 * num_experts + 1, "stride_row_id_map_expert": 1,
                    "stride_input_token": hidden_size, "stride_input_hidden": 1,
                    "stride_output_token": hidden_size, "stride_output_hidden": 1,
                    "stride_merging_probs_token": merging[0], "stride_merging_probs_expert": merging[1],
                    "stride_permuted_probs_token": 1, "stride_unpermuted_probs_token": num_experts,
                    "stride_unpermuted_probs_expert": 1, "num_experts": num_experts, "hidden_size": hidden_size,
                    "PROBS_LOAD_WIDTH": _pow2(num_experts), "WITH_MERGING_PROBS": with_merging_probs,
                    "PERMUTE_PROBS": with_probs, "FUSION_UNPAD": with_unpad,
                    "BLOCK_SIZE": _min_block("_unpermute_kernel")})


unpermute_p = _primitive("te_unpermute_with_mask_map_triton", _unpermute_abstract, _unpermute_lowering)


def unpermute(inp, row_id_map, merging_probs, permuted_probs, pad_offsets):
    """(output [tokens, hidden], unpermuted probs [tokens, experts] or None); unpadded where pad_offsets is given."""
    hidden_size = inp.shape[1]
    num_tokens, num_experts = row_id_map.shape[0], (row_id_map.shape[1] - 1) // 2
    with_merging, with_probs = merging_probs is not None, permuted_probs is not None
    empty = jnp.zeros((0,), inp.dtype)
    out, probs = unpermute_p.bind(
        inp, row_id_map, merging_probs if with_merging else empty, permuted_probs if with_probs else empty,
        pad_offsets if pad_offsets is not None else jnp.zeros((0,), jnp.int32),
        jnp.zeros((num_tokens, hidden_size), inp.dtype),  # unused by the kernel: TE passes them for the signature
        jnp.zeros((num_tokens, num_experts), permuted_probs.dtype) if with_probs else empty,
        num_tokens=num_tokens, num_experts=num_experts, hidden_size=hidden_size, with_merging_probs=with_merging,
        with_probs=with_probs, with_unpad=pad_offsets is not None)
    return out, probs if with_probs else None


# -- unpermute's backward with merging probabilities -----------------------------------------------------------
def _unpermute_bwd_abstract(grad, fwd_input, merging_probs, row_id_map, pad_offsets, *, num_tokens, num_experts,
                            num_out_tokens, hidden_size, with_unpad):
    return _aval((num_out_tokens, hidden_size), grad.dtype), _aval((num_tokens, num_experts), merging_probs.dtype)


def _unpermute_bwd_lowering(ctx, *arrays, num_tokens, num_experts, num_out_tokens, hidden_size, with_unpad):
    return _te_call(
        ctx, "_unpermute_bwd_with_merging_probs_kernel", *arrays, grid=(num_tokens,),
        constexprs={"stride_row_id_map_token": 2 * num_experts + 1, "stride_row_id_map_expert": 1,
                    "stride_fwd_output_grad_token": hidden_size, "stride_fwd_output_grad_hidden": 1,
                    "stride_fwd_input_grad_token": hidden_size, "stride_fwd_input_grad_hidden": 1,
                    "stride_fwd_input_token": hidden_size, "stride_fwd_input_hidden": 1,
                    "stride_merging_probs_token": num_experts, "stride_merging_probs_expert": 1,
                    "stride_merging_probs_grad_token": num_experts, "stride_merging_probs_grad_expert": 1,
                    "num_experts": num_experts, "hidden_size": hidden_size, "PROBS_LOAD_WIDTH": _pow2(num_experts),
                    "FUSION_UNPAD": with_unpad, "BLOCK_SIZE": _min_block("_unpermute_bwd_with_merging_probs_kernel")})


unpermute_bwd_p = _primitive("te_unpermute_bwd_with_merging_probs_triton", _unpermute_bwd_abstract,
                             _unpermute_bwd_lowering)


# -- dispatch and combine, with TE's backward rules ------------------------------------------------------------
def pad_offsets_of(routing_map, align: int):
    """(per-expert offsets of the aligned layout, aligned tokens per expert), as TE computes them."""
    counts = jnp.sum(routing_map, axis=0).astype(jnp.int32)
    aligned = (jnp.ceil(counts / align) * align).astype(jnp.int32)
    padding = jnp.cumsum(aligned - counts)
    return jnp.concatenate([jnp.zeros((1,), padding.dtype), padding[:-1]]), aligned


def padded_rows(num_out_tokens: int, num_experts: int, align: int) -> int:
    """TE's worst-case buffer for an aligned dispatch."""
    return (num_out_tokens + num_experts * (align - 1)) // align * align


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def dispatch(inp, routing_map, probs, num_out_tokens: int, align: int | None):
    """(permuted tokens, permuted probs, row-id map, pad offsets or None, tokens per expert)."""
    return _dispatch_fwd(inp, routing_map, probs, num_out_tokens, align)[0]


def _dispatch_fwd(inp, routing_map, probs, num_out_tokens, align):
    row_id_map = make_row_id_map(routing_map)
    if align is None:
        pad_offsets, per_expert = None, jnp.sum(routing_map, axis=0).astype(jnp.int32)
        rows = num_out_tokens
    else:
        pad_offsets, per_expert = pad_offsets_of(routing_map, align)
        rows = padded_rows(num_out_tokens, routing_map.shape[1], align)
    out, permuted_probs = permute(inp, row_id_map, probs, pad_offsets, rows)
    return (out, permuted_probs, row_id_map, pad_offsets, per_expert), (row_id_map, pad_offsets)


def _dispatch_bwd(num_out_tokens, align, residuals, grads):
    row_id_map, pad_offsets = residuals
    inp_grad, probs_grad = unpermute(grads[0], row_id_map, None, grads[1], pad_offsets)
    return inp_grad, None, probs_grad


dispatch.defvjp(_dispatch_fwd, _dispatch_bwd)


@jax.custom_vjp
def combine(inp, row_id_map, merging_probs, pad_offsets):
    """[tokens, hidden]: each token's expert rows weighted by merging_probs and summed."""
    return unpermute(inp, row_id_map, merging_probs, None, pad_offsets)[0]


def _combine_fwd(inp, row_id_map, merging_probs, pad_offsets):
    out = unpermute(inp, row_id_map, merging_probs, None, pad_offsets)[0]
    return out, (inp, row_id_map, merging_probs, pad_offsets)


def _combine_bwd(residuals, grad):
    inp, row_id_map, merging_probs, pad_offsets = residuals
    num_tokens, num_experts = merging_probs.shape
    inp_grad, probs_grad = unpermute_bwd_p.bind(
        grad, inp, merging_probs, row_id_map, pad_offsets if pad_offsets is not None else jnp.zeros((0,), jnp.int32),
        num_tokens=num_tokens, num_experts=num_experts, num_out_tokens=inp.shape[0], hidden_size=inp.shape[1],
        with_unpad=pad_offsets is not None)
    return inp_grad, None, probs_grad, None


combine.defvjp(_combine_fwd, _combine_bwd)


# -- the programs ------------------------------------------------------------------------------------------------
def programs(concrete: bool = True, labels: set[str] | None = None) -> list[Program]:
    """(label, function, arguments): real arrays from a fixed seed, or (concrete=False) their shapes
    alone, enough to trace and cross-lower. Every token goes to exactly TOP_K experts, so every row of
    an unpadded permuted buffer is written."""
    out_rows = TOKENS * TOP_K
    padded = padded_rows(out_rows, EXPERTS, ALIGN)
    shapes = {"x": ((TOKENS, HIDDEN), jnp.bfloat16), "routing_map": ((TOKENS, EXPERTS), jnp.int32),
              "probs": ((TOKENS, EXPERTS), jnp.float32), "y": ((out_rows, HIDDEN), jnp.bfloat16),
              "y_padded": ((padded, HIDDEN), jnp.bfloat16), "g_y": ((out_rows, HIDDEN), jnp.bfloat16),
              "g_probs": ((out_rows,), jnp.float32), "g_y_padded": ((padded, HIDDEN), jnp.bfloat16),
              "g_probs_padded": ((padded,), jnp.float32), "g_x": ((TOKENS, HIDDEN), jnp.bfloat16)}
    if concrete:
        a = _arrays(shapes)
    else:
        a = {k: jax.ShapeDtypeStruct(shape, dtype) for k, (shape, dtype) in shapes.items()}

    def dispatch_fn(align):
        def run(x, routing_map, probs):
            out, permuted_probs, row_id_map, _, per_expert = dispatch(x, routing_map, probs, out_rows, align)
            return out, permuted_probs, row_id_map, per_expert
        return run

    def dispatch_grad(align):
        def run(x, routing_map, probs, g_y, g_probs):
            _, pullback = jax.vjp(lambda x, p: dispatch(x, routing_map, p, out_rows, align)[:2], x, probs)
            return pullback((g_y, g_probs))
        return run

    def combine_fn(align):
        def run(y, routing_map, probs):
            pad = pad_offsets_of(routing_map, align)[0] if align else None
            return combine(y, make_row_id_map(routing_map), probs, pad)
        return run

    def combine_grad(y, routing_map, probs, g_x):
        _, pullback = jax.vjp(lambda y, p: combine(y, make_row_id_map(routing_map), p, None), y, probs)
        return pullback(g_x)

    found: list[Program] = [
        ("row_id_map", make_row_id_map, (a["routing_map"],)),
        ("dispatch", dispatch_fn(None), (a["x"], a["routing_map"], a["probs"])),
        ("dispatch_grad", dispatch_grad(None), (a["x"], a["routing_map"], a["probs"], a["g_y"], a["g_probs"])),
        ("combine", combine_fn(None), (a["y"], a["routing_map"], a["probs"])),
        ("combine_grad", combine_grad, (a["y"], a["routing_map"], a["probs"], a["g_x"])),
        ("dispatch_padded", dispatch_fn(ALIGN), (a["x"], a["routing_map"], a["probs"])),
        ("dispatch_padded_grad", dispatch_grad(ALIGN),
         (a["x"], a["routing_map"], a["probs"], a["g_y_padded"], a["g_probs_padded"])),
        ("combine_padded", combine_fn(ALIGN), (a["y_padded"], a["routing_map"], a["probs"])),
    ]
    return [p for p in found if labels is None or p[0] in labels]


def _arrays(shapes: dict[str, tuple[tuple[int, ...], Any]]) -> dict[str, Any]:
    """Seeded inputs, the same bits in every process: a top-k routing of random logits (probs: softmax
    over the chosen experts, zero elsewhere) computed on the host, where no XLA autotuning picks how a
    reduction runs, and normal activations and gradients from jax.random (elementwise)."""
    import numpy as np

    logits = np.random.default_rng(0).standard_normal((TOKENS, EXPERTS)).astype(np.float32)
    chosen = np.argsort(-logits, axis=1, kind="stable")[:, :TOP_K]
    rows = np.arange(TOKENS)[:, None]
    top = logits[rows, chosen]
    weights = np.exp(top - top.max(axis=1, keepdims=True))
    routing_map = np.zeros((TOKENS, EXPERTS), np.int32)
    routing_map[rows, chosen] = 1
    probs = np.zeros((TOKENS, EXPERTS), np.float32)
    probs[rows, chosen] = weights / weights.sum(axis=1, keepdims=True)
    found = {"routing_map": jnp.asarray(routing_map), "probs": jnp.asarray(probs)}
    keys = iter(jax.random.split(jax.random.PRNGKey(0), len(shapes)))
    for name, (shape, dtype) in shapes.items():
        if name not in found:
            found[name] = jax.random.normal(next(keys), shape, jnp.float32).astype(dtype)
    return found


AUTOTUNED = ("_permute_kernel", "_unpermute_kernel", "_unpermute_bwd_with_merging_probs_kernel")


def pin_block_size(block_size: int) -> None:
    """Leave TE's autotuned kernels one config, BLOCK_SIZE=block_size (a diagnosis: results that then
    agree between two paths differed by the configs jaxlib's autotuning picked, not by the code)."""
    kernels = load().kernels
    for name in AUTOTUNED:
        kernel = getattr(kernels, name)
        kernel.configs = [c for c in kernel.configs if c.kwargs.get("BLOCK_SIZE") == block_size]
        if not kernel.configs:
            raise ValueError(f"{name} has no autotune config with BLOCK_SIZE={block_size}")
