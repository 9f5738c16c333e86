"""A read-only mapping for the primitive's parameters that jax-triton 0.4 keeps as mappings.

`metaparams`, `backend_options`, `input_output_aliases` and `cost_estimate` are mappings there, so
tools that read jaxprs ask them as mappings. A parameter is also compared and hashed whenever JAX
caches a trace or a lowering, so the mapping is the tuple of its items underneath: equal to, and
hashed as, that tuple by the tuple's own C code (nothing of ours runs when JAX compares calls).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any


class FrozenItems(tuple[tuple[Any, Any], ...]):
    """A read-only mapping over `items` (pairs, or a mapping's items), kept in their order."""

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
        for name, value in tuple.__iter__(self):
            if name == key:
                return value
        return default

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
