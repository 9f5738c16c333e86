"""Telemetry hooks: each counted hit, miss, compile, rejected entry and error, as it happens, to
whoever listens.

`kernel_cache.stats` counts these events for `cachectl stats`; it also hands each one to the
listeners registered here. The core knows no JAX, so this is the seam: `lowering.monitoring`
registers a listener that forwards to `jax.monitoring`, and a program may register its own.

With no listener registered an event costs one function call and one check. A listener runs on the
thread that counted the event (a compile worker, a lowering), so it must be quick and thread-safe;
an exception it raises is reported once as a KernelCacheWarning and otherwise ignored: telemetry
never fails a lookup, a compile or a lowering.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import NamedTuple

from .warnings_once import warn_once

# Event kinds, one per counter of kernel_cache.stats.
HIT, MISS, COMPILE, REJECTED, ERROR = "hit", "miss", "compile", "rejected", "error"
KINDS = (HIT, MISS, COMPILE, REJECTED, ERROR)


class Event(NamedTuple):
    kind: str  # HIT, MISS, COMPILE, REJECTED or ERROR
    tier: str = ""  # HIT and REJECTED: the level ('memory', 'disk', 'shared', 'remote'); else ""
    seconds: float = 0.0  # HIT: compile seconds saved; COMPILE: seconds spent compiling; else 0


Listener = Callable[[Event], None]
_listeners: tuple[Listener, ...] = ()  # replaced whole (copy on write): emit reads it without a lock
_lock = threading.Lock()


def add_listener(listener: Listener) -> None:
    """Call `listener(event)` for every event from now on (once, however often it is added)."""
    global _listeners
    with _lock:
        if listener not in _listeners:
            _listeners = (*_listeners, listener)


def remove_listener(listener: Listener) -> None:
    global _listeners
    with _lock:
        _listeners = tuple(x for x in _listeners if x != listener)


def listeners() -> tuple[Listener, ...]:
    return _listeners


def emit(kind: str, tier: str = "", seconds: float = 0.0) -> None:
    """Hand one event to every listener; a listener's exception is warned about once and dropped."""
    registered = _listeners
    if not registered:
        return
    event = Event(kind, tier, seconds)
    for listener in registered:
        try:
            listener(event)
        except Exception as exc:
            name = getattr(listener, "__qualname__", None) or type(listener).__qualname__
            # even with warnings turned into errors (-W error), a listener's failure stays out of the lookup
            with contextlib.suppress(Exception):
                warn_once(f"event-listener:{getattr(listener, '__module__', '')}.{name}",
                          f"a kernel-cache event listener ({name}) raised {type(exc).__name__}: {exc}; "
                          f"ignored (further failures of it are not reported)")
