"""Concurrent compiles take turns in Triton's front end, the biggest kernel first.

Turns at all: CPython 3.11's `ast` module is not safe to use from several threads at once ("AST
constructor recursion depth mismatch", fixed in 3.12), and the front end (AST to TTIR) holds the GIL,
so interleaving K front ends only makes all K finish late. Biggest first: a big kernel's front end
done first starts its long MLIR/LLVM stages and ptxas (which release the GIL) while the small ones
take their turns (docs/design.md, "Cold start"). The weight is a guess (`compile.front_end_weight`):
a wrong one costs order, never correctness. A waiter interrupted (Ctrl-C) leaves the queue.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import threading
from collections.abc import Iterator


class Turns:
    """A lock whose waiters are served heaviest first (first come, first served among equals)."""

    def __init__(self) -> None:
        self._changed = threading.Condition(threading.Lock())
        self._waiting: list[tuple[float, int]] = []  # (-weight, arrival): the heap's top goes next
        self._arrivals = itertools.count()
        self._held = False

    def waiting(self) -> int:
        """How many threads wait for a turn now."""
        with self._changed:
            return len(self._waiting)

    @contextlib.contextmanager
    def turn(self, weight: float = 0.0) -> Iterator[None]:
        ticket = (-weight, next(self._arrivals))
        with self._changed:
            heapq.heappush(self._waiting, ticket)
            try:
                while self._held or self._waiting[0] != ticket:
                    self._changed.wait()
            except BaseException:  # interrupted while waiting (KeyboardInterrupt): leave the queue
                self._waiting.remove(ticket)
                heapq.heapify(self._waiting)
                self._changed.notify_all()
                raise
            heapq.heappop(self._waiting)
            self._held = True
        try:
            yield
        finally:
            with self._changed:
                self._held = False
                self._changed.notify_all()


FRONT_END = Turns()  # the process's one front end: every compile of every thread takes its turn here
