"""Small helpers jax-triton users import from the package (`jt.cdiv`, ...)."""

from __future__ import annotations

from collections.abc import Sequence


def cdiv(a: int, b: int) -> int:
    """Ceiling division, for grids: cdiv(n, BLOCK) programs cover n elements."""
    return -(-a // b)


def next_power_of_2(x: int) -> int:
    return 1 if x <= 1 else 1 << (int(x) - 1).bit_length()


def strides_from_shape(shape: Sequence[int]) -> tuple[int, ...]:
    """Element strides of a row-major (C-contiguous) array, as XLA lays out custom call buffers."""
    strides, size = [], 1
    for dim in reversed(tuple(shape)):
        strides.append(size)
        size *= int(dim)
    return tuple(reversed(strides))
