"""One Triton call as it was bound: `triton_kernel_call_p`'s parameters as one object, so the lowering
rule, its planning, records and the emitter take the call instead of two dozen keyword parameters."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kernel_cache.value_class import FrozenValue


class BoundCall(FrozenValue):
    _fields = ("kernel", "scalars", "out_avals", "grid", "name", "num_warps", "num_stages", "num_ctas",
               "compute_capability", "enable_fp_fusion", "backend_options", "input_output_aliases", "zeroed_outputs",
               "debug", "serialized_metadata", "metaparams", "has_side_effect", "custom_call_target",
               "pointerless_aliases", "cost_estimate", "arg_tree", "aligned_pointers")
    kernel: Any  # a @triton.jit function, possibly under autotune / heuristics wrappers
    scalars: Sequence[tuple[int, Any]]  # (runtime position, value)
    out_avals: Any  # ((shape, dtype), ...) of the outputs
    grid: Any
    name: str
    num_warps: int | None
    num_stages: int | None
    num_ctas: int
    compute_capability: int | str | None
    enable_fp_fusion: bool
    backend_options: Mapping[str, Any]  # these four are mappings, as jax-triton 0.4 keeps them (`FrozenItems`)
    input_output_aliases: Mapping[int, int]  # {input: output}
    zeroed_outputs: Any
    debug: bool
    serialized_metadata: bytes
    metaparams: Mapping[str, Any]
    has_side_effect: bool
    custom_call_target: str  # "" picks; jax-triton 0.3's custom_call_target_name forces one
    pointerless_aliases: bool  # jax-triton 0.4's in-place reading: aliased outputs get no pointer
    cost_estimate: Mapping[str, Any] | None
    arg_tree: Any  # the pytree of Triton tuple parameters (None: flat)
    aligned_pointers: bool  # pointers hinted 16-byte aligned, as Triton's launcher does (TE compiles without)

    def __init__(self, kernel: Any, scalars: Sequence[tuple[int, Any]], out_avals: Any, grid: Any, name: str,
                 num_warps: int | None, num_stages: int | None, num_ctas: int, compute_capability: int | str | None,
                 enable_fp_fusion: bool, backend_options: Mapping[str, Any],
                 input_output_aliases: Mapping[int, int], zeroed_outputs: Any, debug: bool,
                 serialized_metadata: bytes, metaparams: Mapping[str, Any], has_side_effect: bool,
                 custom_call_target: str = "", pointerless_aliases: bool = False,
                 cost_estimate: Mapping[str, Any] | None = None, arg_tree: Any = None,
                 aligned_pointers: bool = True) -> None:
        self.__dict__.update(kernel=kernel, scalars=scalars, out_avals=out_avals, grid=grid, name=name,
                             num_warps=num_warps, num_stages=num_stages, num_ctas=num_ctas,
                             compute_capability=compute_capability, enable_fp_fusion=enable_fp_fusion,
                             backend_options=backend_options, input_output_aliases=input_output_aliases,
                             zeroed_outputs=zeroed_outputs, debug=debug, serialized_metadata=serialized_metadata,
                             metaparams=metaparams, has_side_effect=has_side_effect,
                             custom_call_target=custom_call_target, pointerless_aliases=pointerless_aliases,
                             cost_estimate=cost_estimate, arg_tree=arg_tree, aligned_pointers=aligned_pointers)

    @classmethod
    def of(cls, params: Mapping[str, Any]) -> "BoundCall":
        """An unknown parameter is a TypeError naming it (a client's translation that drifted from ours)."""
        unknown = set(params) - _NAMES
        if unknown:
            raise TypeError(f"unknown triton_kernel_call parameters: {', '.join(sorted(unknown))}")
        return cls(**params)


_NAMES = frozenset(BoundCall._fields)
