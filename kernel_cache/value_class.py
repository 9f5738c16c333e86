"""Value classes written out instead of made by `dataclasses` at import.

`@dataclass` compiles every method it adds from generated source when the class is created, and a
warm process imports some thirty of them: together, more than it spends on its lookups. A class of a
module every warm process imports subclasses `Value` or `FrozenValue` instead and writes its own
`__init__`, whose parameters are its fields (equality, hashing and repr follow their order; a class
may name others in `_fields`): `self.__dict__.update(field=value, ...)`, which a frozen class's
`__setattr__` does not see (one call
where a frozen dataclass makes an `object.__setattr__` per field). The bases give what the dataclass
would have (equality with the same class only, repr without `_hidden` fields, `__match_args__`;
`FrozenValue`: hashing, and `FrozenInstanceError` on assignment). `replace` here is
`dataclasses.replace` for them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import FrozenInstanceError
from operator import attrgetter
from typing import Any, ClassVar, TypeVar


def _values_of(fields: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    if len(fields) == 1:
        get = attrgetter(fields[0])
        return lambda obj: (get(obj),)
    if not fields:
        return lambda obj: ()
    return attrgetter(*fields)


class Value:
    """Equality and repr by `_fields`; unhashable (mutable). See the module's docstring."""

    __slots__ = ()
    _fields: ClassVar[tuple[str, ...]] = ()
    _hidden: ClassVar[frozenset[str]] = frozenset()  # fields left out of repr
    _values: ClassVar[Any]  # the instance's field values, in order, as one tuple (no bound method)
    # (defining __eq__ leaves __hash__ None here, as a mutable dataclass's is)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if "_fields" not in cls.__dict__ and init is not None:
            code = init.__code__
            cls._fields = code.co_varnames[1:code.co_argcount + code.co_kwonlyargcount]
        cls._values = staticmethod(_values_of(cls._fields))
        setattr(cls, "__match_args__", cls._fields)  # noqa: B010  (mypy knows no __match_args__ on a class)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            values = self._values
            return bool(values(self) == values(other))
        return NotImplemented

    def __repr__(self) -> str:
        hidden = self._hidden
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields if name not in hidden)
        return f"{type(self).__qualname__}({shown})"


class FrozenValue(Value):
    """A `Value` hashed by its fields that refuses assignment after `__init__`."""

    __slots__ = ()

    def __hash__(self) -> int:  # hashable, unlike Value
        return hash(self._values(self))

    def __setattr__(self, name: str, value: Any) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")


V = TypeVar("V", bound=Value)


def replace(value: V, **changes: Any) -> V:
    """A copy of `value` with `changes`, made through its class's `__init__` (as `dataclasses.replace`
    makes one); an unknown name is a TypeError."""
    return type(value)(**{**{name: getattr(value, name) for name in value._fields}, **changes})
