"""One Triton call as it was bound: `triton_kernel_call_p`'s parameters as one object, so the lowering
rule, its planning, records and the emitter take the call instead of two dozen keyword parameters;
and the read-only mapping four of those parameters are (`FrozenItems`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
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


class FrozenItems(tuple[tuple[Any, Any], ...]):
    """A read-only mapping over `items` (pairs, or a mapping's items), kept in their order: the four
    parameters jax-triton 0.4 keeps as mappings, so tools that read jaxprs ask them as mappings. JAX
    compares and hashes a parameter whenever it caches a trace or a lowering, so the mapping is the
    tuple of its items underneath: equal to, and hashed as, that tuple by the tuple's own C code
    (nothing of ours runs when JAX compares calls)."""

    __slots__ = ()

    def __new__(cls, items: Iterable[tuple[Any, Any]] | Mapping[Any, Any] = ()) -> "FrozenItems":
        pairs = tuple(items.items()) if isinstance(items, Mapping) else tuple(items)
        if len({key for key, _ in pairs}) != len(pairs):
            raise ValueError(f"a key named twice in {pairs!r}")
        return super().__new__(cls, pairs)

    items = tuple.__iter__  # the (key, value) pairs in order, read by the tuple's own iterator

    def keys(self) -> list[Any]:
        return [key for key, _ in tuple.__iter__(self)]

    def values(self) -> list[Any]:
        return [value for _, value in tuple.__iter__(self)]

    def get(self, key: Any, default: Any = None) -> Any:
        return next((value for name, value in tuple.__iter__(self) if name == key), default)

    def __getitem__(self, key: Any) -> Any:  # a mapping's, not a tuple's
        for name, value in tuple.__iter__(self):
            if name == key:
                return value
        raise KeyError(key)

    def __iter__(self) -> Iterator[Any]:  # the keys, as a mapping's
        return iter(self.keys())

    def __contains__(self, key: object) -> bool:  # a key, as a mapping's
        return any(name == key for name, _ in tuple.__iter__(self))

    def __getnewargs__(self) -> tuple[tuple[tuple[Any, Any], ...]]:  # copy and pickle
        return (tuple(tuple.__iter__(self)),)

    def __repr__(self) -> str:
        return f"FrozenItems({dict(tuple.__iter__(self))!r})"


Mapping.register(FrozenItems)
