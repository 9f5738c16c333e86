"""One Triton call as it was bound: `triton_kernel_call_p`'s parameters as one object, so the lowering
rule, its planning, records and the emitter take the call instead of two dozen keyword parameters."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple


class BoundCall(NamedTuple):
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
    custom_call_target: str = ""  # "" picks; jax-triton 0.3's custom_call_target_name forces one
    pointerless_aliases: bool = False  # jax-triton 0.4's in-place reading: aliased outputs get no pointer
    cost_estimate: Mapping[str, Any] | None = None
    arg_tree: Any = None  # the pytree of Triton tuple parameters (None: flat)
    aligned_pointers: bool = True  # pointers hinted 16-byte aligned, as Triton's launcher does (TE compiles without)
