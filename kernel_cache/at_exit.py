"""The package's one exit sequence, in the order it must run: compile workers closed, then warm sets
saved (which reads and writes the store), then the counters and the uses kept for the LRU order.
The atexit registration is made when the first step is added (a process that never opened a store
registers nothing), so it runs before the exit hooks of libraries imported earlier (JAX's). A step
that fails never fails the program's exit, nor stops the steps after it.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
from collections.abc import Callable

STEPS = ("compile workers", "warm sets", "counters")
_steps: dict[str, Callable[[], None]] = {}
added = _steps.keys()  # the steps added so far (a read-only view: asked without a call)
_lock = threading.Lock()


def add(step: str, run: Callable[[], None]) -> None:
    """Have `run` called at exit as `step` of the sequence (one function per step: the first kept)."""
    if step not in STEPS:
        raise ValueError(f"no exit step {step!r}; the steps are {', '.join(STEPS)}")
    with _lock:
        if not _steps:
            atexit.register(run_steps)
        _steps.setdefault(step, run)


def run_steps() -> None:
    for step in STEPS:
        found = _steps.get(step)
        if found is not None:
            with contextlib.suppress(Exception):
                found()
