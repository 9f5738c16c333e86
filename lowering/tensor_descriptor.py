"""jax-triton 0.4's `TensorDescriptor`: a host-side TMA descriptor argument over an array.

Where jaxlib has `create_tma_descriptor_parameter` and Triton is 3.7 or newer, a call passing one
compiles it as Triton's `tensordesc<dtype[block]>` parameter and launches it as jax-triton 0.4 does
(`lowering.frontend.custom_call`). Elsewhere the call fails with what is missing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import triton
from jax import tree_util

from .payload import jaxlib_compat as compat
from .utils import strides_from_shape


@tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TensorDescriptor:
    """A TMA descriptor over `base`, with jax-triton 0.4's fields and meaning."""

    base: jax.Array
    shape: tuple[int, ...] = dataclasses.field(metadata={"static": True})
    strides: tuple[int, ...] = dataclasses.field(metadata={"static": True})
    block_shape: tuple[int, ...] = dataclasses.field(metadata={"static": True})
    layout: Any = dataclasses.field(default=None, metadata={"static": True})
    padding: str = dataclasses.field(default="zero", metadata={"static": True})
    round_f32_to_tf32: bool = dataclasses.field(default=False, metadata={"static": True})

    def __post_init__(self) -> None:
        if self.padding not in ("zero", "nan"):
            raise ValueError(f"padding must be 'zero' or 'nan', got {self.padding!r}")
        if not len(self.shape) == len(self.strides) == len(self.block_shape):
            raise ValueError(f"shape, strides and block_shape must have the same length, got {len(self.shape)}, "
                             f"{len(self.strides)}, {len(self.block_shape)}")

    @classmethod
    def from_array(cls, array: Any, block_shape: Sequence[int], layout: Any = None, padding: str = "zero",
                   round_f32_to_tf32: bool = False) -> TensorDescriptor:
        return cls(array, tuple(array.shape), tuple(strides_from_shape(array.shape)), tuple(block_shape), layout,
                   padding, round_f32_to_tf32)


def supported() -> bool:
    return compat.tma_descriptors_in_jaxlib() and compat.tma_descriptors_in_triton()


def refuse(position: int) -> None:
    missing = []
    if not compat.tma_descriptors_in_jaxlib():
        missing.append(f"jaxlib {'.'.join(map(str, compat.jaxlib_version()))} has no create_tma_descriptor_parameter "
                       f"(jax-triton 0.4 requires jax >= 0.11 with it)")
    if not compat.tma_descriptors_in_triton():
        missing.append(f"Triton {triton.__version__} is older than 3.7")
    raise compat.JaxlibSupportError(
        f"argument {position} is a TensorDescriptor (jax-triton 0.4): {'; '.join(missing)}. Pass the array itself and build "
        f"the descriptor in the kernel (tl.make_tensor_descriptor), or call jax-triton 0.4 directly")
