"""Whether the process's C environment may have changed since a value was read from it, without
reading the values again.

Triton reads its cache-invalidating variables with C `getenv`, and the lowering asks once per JAX
module. `os.environ` cannot stand in: `os.putenv`, C `setenv` and native libraries change the C
environment without it. Every such change does change the C `environ` array of pointers (`setenv`
puts a new pointer in a slot or appends one, `unsetenv` shifts the slots, `clearenv` empties it), so
an array whose slots are the same pointers as when a value was read holds the same strings. The one
change it cannot see is a program editing in place a string it gave `putenv()` (such a program must
`putenv` again for any library that copies its environment). Where `environ` cannot be read, the
value is read every time.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")
_POINTER = ctypes.sizeof(ctypes.c_void_p)
_MAX_SLOTS = 1 << 16  # an environment of more variables is read every time


_ENVIRON: ctypes.c_void_p | None  # bound to libc's `environ` variable itself: `.value` reads it now
try:
    _ENVIRON = ctypes.c_void_p.in_dll(ctypes.CDLL(None), "environ")
except (OSError, ValueError, AttributeError, TypeError):
    _ENVIRON = None


def _slots() -> tuple[int, bytes] | None:
    """(the environ array's address, its slots and NULL terminator), or None."""
    if _ENVIRON is None:
        return None
    base = _ENVIRON.value
    if not base:
        return None
    array = ctypes.cast(base, ctypes.POINTER(ctypes.c_void_p))
    count = 0
    while array[count]:
        count += 1
        if count >= _MAX_SLOTS:
            return None
    return base, ctypes.string_at(base, (count + 1) * _POINTER)


class EnvironMemo(Generic[T]):
    """`read()`'s value, read again only when the C environment's array changed (thread-safe)."""

    def __init__(self, read: Callable[[], T]):
        self._read = read
        self._lock = threading.Lock()
        self._seen: tuple[int, bytes, T] | None = None  # (the array's address and slots when read, the value)

    def get(self) -> T:
        seen = self._seen
        if seen is not None and _ENVIRON is not None:  # the same array, every slot and its terminator unchanged
            base, slots, value = seen
            if _ENVIRON.value == base and ctypes.string_at(base, len(slots)) == slots:
                return value
        with self._lock:
            before = _slots()
            value = self._read()
            changed = before is None or _slots() != before  # changed while read (or unreadable): not kept
            self._seen = None if changed or before is None else (before[0], before[1], value)
        return value
