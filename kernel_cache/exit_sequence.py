"""The package's one exit sequence: what must reach the cache when the interpreter exits, in the
order it must. A program's warm sets are saved first (saving reads and writes the store), then the
disk level's deferred copies are written, then the counters and the uses kept for the levels' LRU
order. One atexit registration, made at import, runs the steps the modules registered; a step that
fails never fails the program's exit, nor stops the steps after it.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
from collections.abc import Callable

STEPS = ("warm sets", "deferred copies", "counters")
_steps: dict[str, Callable[[], None]] = {}
_lock = threading.Lock()


def at_exit(step: str, run: Callable[[], None]) -> None:
    """Have `run` called at exit as `step` of the sequence (one function per step: the first kept)."""
    if step not in STEPS:
        raise ValueError(f"no exit step {step!r}; the steps are {', '.join(STEPS)}")
    with _lock:
        _steps.setdefault(step, run)


def run() -> None:
    """Every registered step, in order (what exit does)."""
    for step in STEPS:
        found = _steps.get(step)
        if found is not None:
            with contextlib.suppress(Exception):
                found()


atexit.register(run)
