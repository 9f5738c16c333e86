"""Kernel specs for a call's configs, and their artifacts from the store (compiling only what is missing).

The missing configs of one autotuned call compile at once on the compile threads
(`compiler.compile_processes`, which says why threads).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

import compiler
import kernel_cache  # noqa: F401  (imported with lowering, not inside the first lowering, which it would slow)
from compiler import KernelSpec
from kernel_cache import Session
from kernel_cache.lazy import later

from ..tensor_descriptor import TensorDescriptor

if TYPE_CHECKING:
    from compiler import Artifact, cache_or_compile, compile_processes, key

else:  # a warm call's kernels come from its record: the store lookup by content key runs on a new call only
    cache_or_compile = later("compiler.cache_or_compile")
    compile_processes = later("compiler.compile_processes")  # worker processes, where they pay
    key = later("compiler.key")

_TRITON_DTYPES = {
    "bfloat16": "bf16", "float64": "fp64", "float32": "fp32", "float16": "fp16",
    "float8_e4m3fn": "fp8e4nv", "float8_e5m2": "fp8e5", "float8_e4m3fnuz": "fp8e4b8",
    "float8_e5m2fnuz": "fp8e5b16", "int64": "i64", "int32": "i32", "int16": "i16", "int8": "i8",
    "uint64": "u64", "uint32": "u32", "uint16": "u16", "uint8": "u8", "bool": "i1",
}


@functools.lru_cache(maxsize=256)
def pointer_type(dtype: Any) -> str:
    """A dtype's Triton pointer type (the lowering asks per operand)."""
    name = np.dtype(dtype).name
    try:
        return "*" + _TRITON_DTYPES[name]
    except KeyError:
        raise TypeError(f"arrays of dtype {name} cannot be passed to a Triton kernel") from None


_FP32_MAX = float(np.finfo(np.float32).max)


def _typed_scalar(value: Any) -> Any:
    """Python floats beyond fp32's range travel as fp64, as jax-triton passes them; the rest keep
    Triton's own typing (fp32 floats, i32/i64/u64 ints, booleans)."""
    if isinstance(value, float) and math.isfinite(value) and abs(value) > _FP32_MAX:  # math's, not numpy's: no array
        return compiler.Scalar("fp64", value)
    return value


def argument_types(in_dtypes: Sequence[Any], scalars: Sequence[tuple[int, Any]], out_dtypes: Sequence[Any],
                   arg_tree: Any, aligned: bool = True) -> list[Any]:
    """The kernel's runtime argument types in order: the inputs with the scalars at their positions,
    grouped as its parameters take them (`arg_tree`: a tuple parameter as one tuple), then the outputs.
    `aligned`: pointers carry Triton's 16-byte alignment hint (False: as TransformerEngine compiles)."""
    pointer: Any = pointer_type if aligned else (lambda d: compiler.Pointer(pointer_type(d), aligned=False))
    inputs: list[Any] = [pointer(d) for d in in_dtypes]
    for position, value in scalars:  # positions are ascending, counted over arrays and scalars
        inputs.insert(position, _typed_scalar(value))
    grouped = inputs if arg_tree is None else list(arg_tree.unflatten(inputs))
    return [_descriptor(v) for v in grouped] + [pointer(d) for d in out_dtypes]


def _descriptor(value: Any) -> Any:
    """A TensorDescriptor (its base already a pointer type) as the compiler's TensorDesc, in tuples too."""
    if isinstance(value, tuple):
        return tuple(_descriptor(v) for v in value)
    if isinstance(value, TensorDescriptor):
        return compiler.TensorDesc(
            dtype=str(value.base).lstrip("*"), block_shape=tuple(int(b) for b in value.block_shape),
            layout=None if value.layout is None else repr(value.layout), shape=tuple(int(d) for d in value.shape),
            strides=tuple(int(s) for s in value.strides), padding=value.padding,
            round_f32_to_tf32=bool(value.round_f32_to_tf32))
    return value


def fetch(specs: Sequence[KernelSpec], session: Session, on_miss: Callable[[], object]) -> list[tuple[Artifact, str]]:
    """(artifact, content key) for `specs`, in order: hits are plain store reads; misses compile on the
    compile workers (the first in this thread), after `on_miss()`."""
    store, keys = session.store, key.session_keys(session)
    found = [cache_or_compile.lookup(spec, store, keys=keys) for spec in specs]
    missing = [i for i, (art, _) in enumerate(found) if art is None]
    if missing:
        on_miss()
    pooled = session.config.compile_threads > 1  # one at a time: no threads, no worker processes
    if len(missing) > 1 and pooled:
        compile_processes.expect(session.config, len(missing) - 1)
        others = {i: compile_processes.submit(session.config, _build, specs[i], store, keys, True) for i in missing[1:]}
        found[missing[0]] = _build(specs[missing[0]], store, keys, True)
        for i, future in others.items():
            found[i] = future.result()
    else:
        for i in missing:
            found[i] = _build(specs[i], store, keys, pooled)
    return cast("list[tuple[Artifact, str]]", found)  # every None was filled by a compile


def _build(spec: KernelSpec, store: Any, keys: key.KeyMemo, pooled: bool) -> tuple[Artifact, str]:
    """A spec `fetch` just missed: under the build lock the store only probes for a neighbour's build.
    `pooled`: on an idle worker process where one runs (compiles one at a time never import the pool)."""
    if pooled:
        return compile_processes.get_or_compile(spec, store, keys=keys, known_missing=True)
    return cache_or_compile.get_or_compile(spec, store, keys=keys, known_missing=True)
