"""Triton's own answers, the oracles the compiler tests compare against (tests only)."""

from __future__ import annotations

from typing import Any

import triton

from compiler.triton_compat import backend_class, gpu_target


class _AlignedPointer:
    """Stands in for a device buffer when asking Triton how it would specialize an argument
    (tests compare `specialize` with Triton's native rules through it)."""

    def __init__(self, dtype: str, aligned: bool):
        self.dtype = dtype
        self._ptr = 16 if aligned else 8

    def data_ptr(self) -> int:
        return self._ptr

    def ptr_range(self) -> int:
        # Buffer size is unknown when compiling ahead of time: claim "larger than 2 GB" so the HIP
        # backend never assumes 32-bit buffer offsets (correct for any size).
        return 2**63 - 1


def native_specialize(backend_name: str, value: Any, *, is_const: bool = False, specialize: bool = True,
                      align: bool = True) -> tuple[str, Any]:
    """Triton's own native rule, for tests that keep `specialize` honest."""
    from triton._C.libtriton import native_specialize_impl

    cls = backend_class(backend_name)
    if isinstance(value, str):
        value = _AlignedPointer(value.lstrip("*"), align)
    try:
        return native_specialize_impl(cls, value, is_const, specialize, align)
    except ImportError:
        # Triton 3.6's HIP backend imports torch to size buffers; without torch, answer as it
        # would for a buffer of unknown size: the generic rules, no 32-bit buffer-offset hint.
        from triton.backends.compiler import BaseBackend

        return native_specialize_impl(BaseBackend, value, is_const, specialize, align)


def reference_compile(src, target, options: dict):
    """triton.compile, the fidelity oracle, with its on-disk cache pointed nowhere useful."""
    return triton.compile(src, target=gpu_target(target), options=dict(options))
